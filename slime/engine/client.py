"""`EngineClient`: the SGLang HTTP control calls on one engine URL (docs/architecture.md#engine-routes).

Plain HTTP, no process and no Ray: the engine's launcher, the weight-sync classes, the rollout
manager and the tests all talk to a server through this, whoever started it (an external engine
included). Timeouts are in seconds. Every route and body is SGLang 0.5.23's (its route table and
io_struct request types; `tests/engine/sglang/test_sglang_contract.py` checks each call against the wheel).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from slime.engine import http_client
from slime.engine.http_client import EngineHTTPError

LORA_REASON = "error_message"  # the LoRA routes' reply is SGLang's LoRAUpdateOutput (io_struct.py)
# The hash of SGLang's /weights_checker checksums of tensors on the CPU (`slime.wire.tensors.weight_checksum`); a
# server on a GPU hashes its tensors there with a kernel of its own, which the trainer does not reproduce
SGLANG_CPU_HASH = "sha256_first8"


@dataclass(frozen=True, kw_only=True)
class EngineDigests:
    """What an engine holds, as it reports it for a verified sync (slime.sync.verify).

    tensors: {the engine's tensor name: its digest} of an unsharded engine, None when it cannot say (`why_not`);
    adapters: {adapter name: {peft tensor name: digest}} of the LoRA adapters it holds, None when it cannot say;
    hash: how the digests are made ("sha256": the hex sha256 of the tensor's bytes; SGLANG_CPU_HASH)."""

    hash: str
    tensors: Optional[dict[str, str]]
    adapters: Optional[dict[str, dict[str, str]]] = None
    why_not: str = ""


def largest_parts(reports: Iterable[dict[str, float]]) -> dict[str, float]:
    """{part: its largest value over the reports} (memory reports of ranks or of engines, GiB)."""
    parts: dict[str, float] = {}
    for report in reports:
        for part, value in report.items():
            parts[part] = max(parts.get(part, value), value)
    return parts


class EngineClient:
    """Control calls of one SGLang-compatible server at `url` (`http://host:port`)."""

    # {a fused module of the engine's: the HF modules whose weights it concatenates along dim 0, in order}; the
    # names its weight digests use (`weight_digests`); SGLang-dialect engines here report HF names
    packed_modules: ClassVar[dict[str, tuple[str, ...]]] = {}
    digest_hash: ClassVar[str] = SGLANG_CPU_HASH  # how `weight_digests` are made (`EngineDigests.hash`)
    vocab_padding: ClassVar[int] = 1  # the engine holds its embedding and LM head with rows padded to a multiple

    def __init__(self, url: str, *, timeout_s: float = 60.0):
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)

    def _get(self, path: str, timeout: Optional[float] = None) -> Any:
        return http_client.get(self.url + path, timeout=timeout or self.timeout_s)

    def _post(self, path: str, payload: Any = None, timeout: Optional[float] = None) -> Any:
        return http_client.post(self.url + path, payload, timeout=timeout or self.timeout_s)

    def is_healthy(self, path: str = "/health_generate", timeout: float = 10.0) -> bool:
        """True iff GET `path` answers 200 within `timeout` seconds."""
        try:
            status, _ = http_client.request("GET", self.url + path, timeout=timeout)
        except EngineHTTPError:
            return False
        return status == 200

    def flush_cache(self, max_attempts: int = 60, interval_s: float = 1.0) -> None:
        """GET /flush_cache, retried while non-200 (SGLang refuses while requests run)."""
        status, last = None, None
        for _ in range(max(1, max_attempts)):
            status, last = http_client.request("GET", self.url + "/flush_cache", timeout=self.timeout_s)
            if status == 200:
                return
            time.sleep(interval_s)
        raise EngineHTTPError(
            "GET", self.url + "/flush_cache", status, f"still failing after {max_attempts} tries: {last}"
        )

    def pause_generation(self, mode: Optional[str] = None) -> None:
        """POST /pause_generation; SGLang's default mode aborts in-flight requests, new ones wait."""
        self._post("/pause_generation", {} if mode is None else {"mode": mode})

    def continue_generation(self) -> None:
        self._post("/continue_generation", {})

    def begin_weight_update(self) -> None:
        """POST /begin_weight_update: open the session SGLang's tensor and distributed updates must run in
        (`scheduler_components/weight_updater.py`: an update outside one fails)."""
        self._weights_call("/begin_weight_update", {}, self.timeout_s)

    def finish_weight_update(self, weight_version: Optional[str]) -> None:
        """POST /end_weight_update: close the session (SGLang stamped the version with each bucket)."""
        self._weights_call("/end_weight_update", {}, self.timeout_s)

    @staticmethod
    def prepare_disk_checkpoint(path: str) -> None:
        """Make a pushed HF directory loadable by this kind of server before any of them reloads it (SGLang:
        nothing to do)."""

    def update_weights_from_disk(
        self,
        path: str,
        weight_version: Optional[str] = None,
        load_format: Optional[str] = None,
        timeout: float = 600.0,
        *,
        flush_cache: bool = True,
    ) -> dict:
        """POST /update_weights_from_disk; raises EngineHTTPError unless it reports success. `flush_cache=False` while
        an in-place pause holds requests (SGLang 0.5.23 `UpdateWeightsFromDiskReqInput.flush_cache`, default true:
        its flush is refused while requests run, `weight_updater.py: flush_cache_after_weight_update`, and the
        update then reports failure)."""
        payload: dict[str, Any] = {"model_path": str(path), "flush_cache": flush_cache}
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        if load_format is not None:
            payload["load_format"] = load_format
        url = self.url + "/update_weights_from_disk"
        status, body = http_client.request("POST", url, payload, timeout=timeout)
        if status != 200 or not (isinstance(body, dict) and body.get("success")):
            raise EngineHTTPError("POST", url, status, str(body))
        return body

    def _weights_call(self, path: str, payload: dict, timeout: float, reason: str = "message") -> dict:
        """POST a weight-update call; raises EngineHTTPError (naming this URL, with the body's `reason` field) unless it
        reports success."""
        url = self.url + path
        status, body = http_client.request("POST", url, payload, timeout=timeout)
        if status != 200 or not (isinstance(body, dict) and body.get("success")):
            message = body.get(reason, body) if isinstance(body, dict) else body
            raise EngineHTTPError("POST", url, status, str(message))
        return body

    def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout: float = 600.0,
    ) -> dict:
        """POST /init_weights_update_group; returns once the engine joined (all ranks must join together)."""
        return self._weights_call(
            "/init_weights_update_group",
            {
                "master_address": master_address,
                "master_port": int(master_port),
                "rank_offset": int(rank_offset),
                "world_size": int(world_size),
                "group_name": group_name,
                "backend": backend,
            },
            timeout,
        )

    def update_weights_from_distributed(
        self,
        *,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        group_name: str,
        weight_version: Optional[str] = None,
        flush_cache: bool = False,
        timeout: float = 600.0,
    ) -> dict:
        """POST /update_weights_from_distributed; the engine then receives the broadcasts in `names` order."""
        payload: dict[str, Any] = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        return self._weights_call("/update_weights_from_distributed", payload, timeout)

    @staticmethod
    def trainer_weight_group(*, address: str, world_size: int, group_name: str, backend: str, timeout_s: float):
        """The trainer's (rank 0's) end of the group `/init_weights_update_group` joins: SGLang's
        `init_custom_process_group` rendezvous (`slime.wire.weight_group`); `.port` to send, `.join()`."""
        # torch: the driver and the rollout manager import this client and never load torch; the trainer does
        from slime.wire.weight_group import HostedWeightGroup

        return HostedWeightGroup(
            address=address, world_size=world_size, group_name=group_name, backend=backend, timeout_s=timeout_s
        )

    def destroy_weights_update_group(self, group_name: str, timeout: float = 60.0) -> dict:
        return self._weights_call("/destroy_weights_update_group", {"group_name": group_name}, timeout)

    def update_weights_from_tensor(
        self,
        serialized_named_tensors: Sequence[str],
        *,
        load_format: str = "flattened_bucket",
        weight_version: Optional[str] = None,
        flush_cache: bool = False,
        keep_mapping: bool = False,
        timeout: float = 600.0,
    ) -> dict:
        """POST /update_weights_from_tensor with one serialised bucket per engine TP rank. `keep_mapping`: the
        bucket's buffer will carry later buckets too, so the engine keeps it mapped (not SGLang's: only an engine
        whose record says `reuses_tensor_buffers` is sent it)."""
        payload: dict[str, Any] = {
            "serialized_named_tensors": list(serialized_named_tensors),
            "load_format": load_format,
            "flush_cache": flush_cache,
        }
        if keep_mapping:
            payload["keep_mapping"] = True
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        return self._weights_call("/update_weights_from_tensor", payload, timeout)

    def load_lora_adapter_from_tensors(
        self,
        name: str,
        config: dict,
        serialized_named_tensors: Sequence[str],
        *,
        expected_checksums: Optional[dict[str, str]] = None,
        timeout: float = 600.0,
    ) -> dict:
        """POST /load_lora_adapter_from_tensors (`io_struct.LoadLoRAAdapterFromTensorsReqInput`): the peft adapter
        `config` (adapter_config.json as a dict) and one serialised flattened bucket of its tensors per TP rank;
        `expected_checksums` ({name: sha256}) has every rank check what it received."""
        payload = {
            "lora_name": name,
            "config_dict": config,
            "serialized_named_tensors": list(serialized_named_tensors),
            "load_format": "flattened_bucket",
        }
        if expected_checksums is not None:
            payload["expected_checksums"] = expected_checksums
        return self._weights_call("/load_lora_adapter_from_tensors", payload, timeout, LORA_REASON)

    def load_lora_adapter(self, name: str, path: str, *, timeout: float = 600.0) -> dict:
        """POST /load_lora_adapter {lora_name, lora_path} (`io_struct.LoadLoRAAdapterReqInput`): a peft directory."""
        return self._weights_call(
            "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, timeout, LORA_REASON
        )

    def unload_lora_adapter(self, name: str, *, timeout: float = 60.0) -> dict:
        return self._weights_call("/unload_lora_adapter", {"lora_name": name}, timeout, LORA_REASON)

    def update_weight_version(self, version: str, *, abort_all_requests: bool = True) -> None:
        """POST /update_weight_version {new_version, abort_all_requests} (`io_struct.UpdateWeightVersionReqInput`;
        by default it aborts what runs, harmless under an aborting pause): the version later responses carry, after
        a push that carries none itself."""
        body = {"new_version": str(version), "abort_all_requests": abort_all_requests}
        self._weights_call("/update_weight_version", body, self.timeout_s)

    def check_weights(self, action: str, timeout: float = 600.0) -> dict:
        """POST /weights_checker {action}: snapshot | reset_tensors | compare | checksum (checksum: `ranks`, one
        `{checksums, per_gpu_checksum, parallelism_info}` per TP rank, and `per_engine_checksum`). Raises
        EngineHTTPError with the engine's message unless it reports success (compare: tensors differ)."""
        return self._weights_call("/weights_checker", {"action": action}, timeout)

    def weight_digests(self, timeout: float = 600.0) -> EngineDigests:
        """The engine's tensors by name from `/weights_checker` checksum, when its one rank holds them whole and
        hashed on the CPU (the built-in engine says so per rank; SGLang does on a CPU device), with its LoRA
        adapters' tensors where it reports them (the built-in engine)."""
        ranks = self.check_weights("checksum", timeout=timeout).get("ranks") or []
        if len(ranks) != 1:
            return EngineDigests(hash=SGLANG_CPU_HASH, tensors=None, why_not=f"its weights are in {len(ranks)} shards")
        rank = ranks[0]
        hashed = rank.get("hash") or (SGLANG_CPU_HASH if self.server_info().get("device") == "cpu" else None)
        if hashed != SGLANG_CPU_HASH:
            return EngineDigests(
                hash=SGLANG_CPU_HASH, tensors=None, why_not="it hashes tensors on its GPU with a kernel of its own"
            )
        return EngineDigests(hash=hashed, tensors=dict(rank.get("checksums") or {}), adapters=rank.get("lora_adapters"))

    def server_info(self) -> dict:
        return self._get("/server_info")

    def release_memory(self, tags: Optional[Sequence[str]] = None) -> None:
        """POST /release_memory_occupation (all tags when None: weights, kv_cache, cuda_graph)."""
        self._post("/release_memory_occupation", {} if tags is None else {"tags": list(tags)})

    def resume_memory(self, tags: Optional[Sequence[str]] = None) -> None:
        self._post("/resume_memory_occupation", {} if tags is None else {"tags": list(tags)})

    def abort_all(self) -> None:
        self._post("/abort_request", {"abort_all": True})

    def num_requests(self) -> int:
        """Running plus waiting requests over every data-parallel rank (GET /v1/loads)."""
        loads = self.loads().get("loads", [])
        return sum(int(e.get("num_running_reqs", 0)) + int(e.get("num_waiting_reqs", 0)) for e in loads)

    def abort_all_and_wait_idle(self, timeout_s: float = 60.0, interval_s: float = 0.05) -> None:
        """POST /abort_request {abort_all} on every poll of /v1/loads until no request runs or waits (requests
        the router forwards after an abort start anyway; slime re-sends it the same way).

        Raises TimeoutError naming the engine when requests remain after `timeout_s` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.abort_all()
            left = self.num_requests()
            if left == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url}: {left} requests still in flight {timeout_s:.0f} s after abort_all")
            time.sleep(interval_s)

    def get_weight_version(self) -> str:
        """The version the engine stamps on responses (GET /model_info's `weight_version`)."""
        return str(self._get("/model_info")["weight_version"])

    def loads(self) -> dict:
        """GET /v1/loads (engine-specific shape; the hf engine's is documented in its server)."""
        return self._get("/v1/loads?include=core")

    def memory_gib(self) -> dict[str, float]:
        """The engine's memory by part, GiB, `{part: GiB}`: GET /v1/loads?include=memory, each data-parallel rank's
        `memory` section (SGLang's `MemoryMetrics`, `managers/load_snapshot.py`: weight_gb, kv_cache_gb and graph_gb,
        filled in GiB by `scheduler_components/load_inquirer.py`; the hf engine's `weight_gb`, `peak_gb`), each part
        named without `_gb` and the largest over the ranks; {} when the engine reports none."""
        ranks = self._get("/v1/loads?include=memory").get("loads", [])
        sections = [(rank.get("memory") or {}).items() for rank in ranks]
        return largest_parts(
            {key[:-3]: float(v) for key, v in section if key.endswith("_gb") and isinstance(v, (int, float))}
            for section in sections
        )

    def __repr__(self) -> str:
        return f"EngineClient({self.url})"
