"""SGLang's own code as a judge, in a process of its own (`tests.helpers.sglang_real.bootstrap`).

`SGLangProbe.start()` launches `python -m tests.helpers.sglang_probe`; each method sends one JSON line and
returns the probe's answer, computed by SGLang 0.5.23's functions:

- `routes()`: `[path, [methods]]` of the real FastAPI app (`sglang/srt/entrypoints/http_server.py`, its
  `app.routes`, `/v1/loads` included);
- `check_request(method, path, body)`: the io_struct type the route's handler takes, built from `body` the way
  FastAPI builds it (pydantic, SGLang's own schema), the body keys that type does not have, and any error;
  `/generate` bodies also pass SGLang's JSON contract gate (`api_contract.generate_contract_error`) and their
  `sampling_params` bind to `SamplingParams`;
- `parse_cli(argv)`: the namespace of `ServerArgs.add_cli_args`'s parser for `argv`, and whether
  `ServerArgs.from_cli_args` accepts it;
- `open_bucket(items)`: each TP rank's `serialized_named_tensors` item deserialised as a TP worker does
  (`monkey_patch_torch_reductions` + `MultiprocessingSerializer.deserialize`) and loaded through the model
  runner's `WeightUpdater._update_weights_from_flattened_bucket`; returns `[{name: {dtype, shape, sha256}}]`;
- `join_group(...)`, `receive(...)`, `destroy(group_name)`: a weight-update group joined through
  `WeightUpdater.init_weights_update_group` (SGLang's `init_custom_process_group`) as rank `rank_offset`
  (blocks until the trainer side joins), one `/update_weights_from_distributed` request's tensors received
  with `receive_weights_from_distributed` (`{name: {dtype, shape, sha256}}`), the group destroyed;
- `checksums(model_path)`: `WeightChecker`'s "checksum" action over an HF model directory.

The real methods are called on stand-in `self` objects holding only the attributes they read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

MARK = "SGLANG_PROBE "


class SGLangProbe:
    """Client of one probe process (thread-safe: one request at a time per call, answers matched by id)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self._lock = threading.Lock()
        self._next = 0
        self._answers: dict[int, dict] = {}
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def start(cls) -> SGLangProbe:
        from tests.helpers.sglang_real import child_env, require

        require()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.sglang_probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=child_env(),
        )
        probe = cls(proc)
        probe.call("ping", timeout=120)
        return probe

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                answer = json.loads(line[len(MARK) :])
                with self._cond:
                    self._answers[answer["id"]] = answer
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def call(self, command: str, timeout: float = 60.0, **kwargs: Any) -> Any:
        with self._lock:
            self._next += 1
            ident = self._next
            self.proc.stdin.write(json.dumps({"id": ident, "command": command, "kwargs": kwargs}) + "\n")
            self.proc.stdin.flush()
        with self._cond:
            if not self._cond.wait_for(lambda: ident in self._answers or self.proc.poll() is not None, timeout):
                raise TimeoutError(f"SGLang probe: no answer to {command} in {timeout:.0f} s")
            if ident not in self._answers:
                raise RuntimeError(f"SGLang probe exited with status {self.proc.returncode} during {command}")
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise RuntimeError(f"SGLang probe {command}: {answer['error']}")
        return answer["result"]

    def routes(self) -> list[tuple[str, list[str]]]:
        return [(path, methods) for path, methods in self.call("routes")]

    def check_request(self, method: str, path: str, body: Any) -> dict:
        return self.call("check_request", method=method, path=path, body=body)

    def parse_cli(self, argv: list[str]) -> dict:
        return self.call("parse_cli", argv=argv)

    def open_bucket(self, items: list[str]) -> list[dict]:
        return self.call("open_bucket", items=items)

    def join_group(self, timeout: float = 120.0, **kwargs: Any) -> str:
        return self.call("join_group", timeout=timeout, **kwargs)

    def receive(self, timeout: float = 120.0, **kwargs: Any) -> dict:
        return self.call("receive", timeout=timeout, **kwargs)

    def destroy(self, group_name: str) -> str:
        return self.call("destroy", group_name=group_name)

    def checksums(self, model_path: str) -> dict:
        return self.call("checksums", timeout=120, model_path=model_path)

    def loads_entry(self, memory: list, include: str) -> dict:
        return self.call("loads_entry", memory=memory, include=include)

    def version_meta(self, changes: list, current: str, num_tokens: int) -> dict:
        return self.call("version_meta", changes=changes, current=current, num_tokens=num_tokens)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ------------------------------------------------------------------------------------------- the probe's side
def routes() -> list:
    from tests.helpers.sglang_routes import route_table

    by_path: dict[str, list[str]] = {}
    for method, path in route_table():
        by_path.setdefault(path, []).append(method)
    return [[path, sorted(methods)] for path, methods in sorted(by_path.items())]


def check_request(method: str, path: str, body: Any) -> dict:
    from tests.helpers import sglang_routes

    table = sglang_routes.route_table()
    if (method, path) not in table:
        raise LookupError(f"{method} {path} is not a route of SGLang's app")
    body_type = table[(method, path)]
    answer: dict[str, Any] = {"type": None, "unknown": [], "error": None, "value": None}
    if body_type is None:
        answer["unknown"] = sorted(body) if isinstance(body, dict) else []
        return answer
    answer["type"] = body_type.__name__
    answer["unknown"] = sorted(set(body or {}) - set(sglang_routes.field_names(body_type)))
    value, detail = sglang_routes.parse_body(body_type, body)
    if detail is not None:
        answer["error"] = json.dumps(detail)
        return answer
    answer["value"] = sglang_routes.to_builtins(value)
    if path == "/generate":
        answer["error"] = "; ".join(sglang_routes.generate_errors(body)) or None
    return answer


def parse_cli(argv: list[str]) -> dict:
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        namespace = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        return {"namespace": None, "parse_error": str(exc), "server_args_error": None}
    try:
        ServerArgs.from_cli_args(namespace)
        error = None
    except Exception as exc:  # noqa: BLE001 - reported, not raised: GPU-only checks may refuse a CPU machine
        error = f"{type(exc).__name__}: {exc}"
    from tests.helpers.sglang_routes import to_builtins

    return {"namespace": to_builtins(vars(namespace)), "parse_error": None, "server_args_error": error}


def _digest(tensors) -> dict:
    import hashlib

    import torch

    out = {}
    for name, tensor in tensors:
        flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        out[name] = {
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
            "sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
        }
    return out


class _Model:
    """What the weight updater loads into: records the tensors `load_weights` receives."""

    def __init__(self):
        self.loaded: list = []

    def load_weights(self, named_tensors):
        self.loaded.extend((name, tensor.clone()) for name, tensor in named_tensors)


def open_bucket(items: list[str]) -> list[dict]:
    from types import SimpleNamespace

    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

    monkey_patch_torch_reductions()
    per_rank = []
    for item in items:  # TP rank i deserialises item i (TpModelWorker.deserialize_own_rank)
        payload = MultiprocessingSerializer.deserialize(item)
        strangers = {type(m).__module__ + "." + type(m).__qualname__ for m in payload["metadata"]}
        strangers -= {FlattenedTensorMetadata.__module__ + "." + FlattenedTensorMetadata.__qualname__}
        if strangers:  # SGLang's updater reads the fields by name; a look-alike class would pass it by chance
            raise TypeError(f"metadata items are not SGLang's FlattenedTensorMetadata: {sorted(strangers)}")
        model = _Model()
        WeightUpdater._update_weights_from_flattened_bucket(SimpleNamespace(get_model=lambda m=model: m), payload)
        per_rank.append(_digest(model.loaded))
    return per_rank


_GROUPS: dict[str, Any] = {}  # this probe process's joined groups, by name (the stand-in updaters)


def join_group(
    *, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
) -> str:
    import datetime
    from types import SimpleNamespace

    import torch.distributed as dist
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    if not dist.is_initialized():  # an SGLang TP worker has its own world; the updater asserts it exists
        dist.init_process_group(
            "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(hours=1)
        )
    updater = SimpleNamespace(tp_rank=0, device="cpu", _model_update_group={})
    ok, message = WeightUpdater.init_weights_update_group(
        updater, master_address, master_port, rank_offset, world_size, group_name, backend=backend
    )
    if not ok:
        raise RuntimeError(message)
    _GROUPS[group_name] = updater
    return message


def receive(*, group_name: str, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> dict:
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    weights = WeightUpdater.receive_weights_from_distributed(
        _GROUPS[group_name], names=names, dtypes=dtypes, shapes=shapes, group_name=group_name
    )
    return _digest(weights)


def destroy(*, group_name: str) -> str:
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    ok, message = WeightUpdater.destroy_weights_update_group(_GROUPS.pop(group_name), group_name)
    return message


def checksums(*, model_path: str) -> dict:
    """SGLang's `WeightChecker` checksum action over the HF model at `model_path` (fp32, one rank)."""
    import torch
    from sglang.srt.utils.weight_checker import WeightChecker
    from transformers import AutoModelForCausalLM

    class OneRank(WeightChecker):
        def __init__(self, model):  # the parent reads the rank placement from SGLang's runtime context
            self._get_model = lambda: model
            self._placement = dict(tp_rank=0, tp_size=1, dp_rank=0, dp_size=1, pp_rank=0, pp_size=1)
            self._snapshot_tensors = self._snapshot_arena = None

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return OneRank(model).handle("checksum", role="target")


def loads_entry(*, memory: list, include: str) -> dict:
    """One rank's entry of SGLang's GET /v1/loads?include=`include` (`entrypoints/v1_loads.py`: `LoadSnapshot.to_dict`)
    for a scheduler whose `MemoryMetrics` are `memory` (weight_gb, kv_cache_gb, graph_gb, token_capacity)."""
    from sglang.srt.managers.load_snapshot import LoadSnapshot, MemoryMetrics

    snapshot = LoadSnapshot(dp_rank=0, num_running_reqs=2, memory=MemoryMetrics(*memory))
    return snapshot.to_dict(set(include.split(",")))


def version_meta(*, changes: list, current: str, num_tokens: int) -> dict:
    """The `meta_info` weight-version fields SGLang gives a request that ends with `num_tokens` output tokens under
    `current`, the version having changed at each of `changes` ([old version, output tokens then]):
    `compute_weight_version_spans`, then the tokenizer manager's `add_weight_versions_to_meta_info`."""
    from sglang.srt.utils.weight_versions import (
        WeightVersionEvent,
        add_weight_versions_to_meta_info,
        compute_weight_version_spans,
    )

    events = [WeightVersionEvent(old_version=old, num_output_tokens=n) for old, n in changes]
    meta: dict = {}
    add_weight_versions_to_meta_info(meta, compute_weight_version_spans(events, current, num_tokens), num_tokens)
    return meta


_COMMANDS = {
    "ping": lambda: "pong",
    "loads_entry": loads_entry,
    "routes": routes,
    "check_request": check_request,
    "parse_cli": parse_cli,
    "open_bucket": open_bucket,
    "join_group": join_group,
    "receive": receive,
    "destroy": destroy,
    "checksums": checksums,
    "version_meta": version_meta,
}


def main() -> None:
    import concurrent.futures
    import os

    from tests.helpers.sglang_real import bootstrap

    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # SGLang's prints must not interleave with answers
    bootstrap()
    import sglang.srt.entrypoints.http_server  # noqa: F401 - imported once, before the first request

    write_lock = threading.Lock()

    def answer(request: dict) -> None:
        try:
            reply = {"id": request["id"], "result": _COMMANDS[request["command"]](**request["kwargs"])}
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the test
            reply = {"id": request["id"], "error": f"{type(exc).__name__}: {exc}"}
        with write_lock:
            out.write(MARK + json.dumps(reply) + "\n")

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:  # a join blocks; others go on
        for line in sys.stdin:
            pool.submit(answer, json.loads(line))


if __name__ == "__main__":
    main()
