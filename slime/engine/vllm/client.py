"""`VLLMClient`: the framework's engine control calls mapped onto vLLM 0.32.0's HTTP API.

The weight-sync classes and the rollout manager speak `EngineClient`'s vocabulary (pause, flush, abort,
release/resume memory, the three weight-update modes); this subclass answers it with the routes of
`python -m vllm.entrypoints.launchers.api_server.entry` started with VLLM_SERVER_DEV_MODE=1 (which mounts
the dev and RL routers):

    pause / continue          POST /pause?mode=abort, POST /resume
    flush cache               POST /reset_prefix_cache                -> {"success": bool} (false while blocks are held)
    abort everything          POST /abort_requests {}                 ; in flight: GET /load {"server_load"}
    release / resume memory   POST /sleep?level=2, POST /wake_up?tags=weights | tags=kv_cache
    weight version            GET /weight_info, POST /update_weight_version {"new_version"}
    LoRA adapter              POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace}, /v1/unload_lora_adapter
    disk                      POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}
    distributed (nccl) and    POST /init_weight_transfer_engine {"init_info"}, per push POST /start_weight_update,
    tensor (ipc) transfers    per bucket POST /update_weights {"update_info"}, POST /finish_weight_update
                              {"weight_version"}; POST /shutdown_weight_transfer_engine drops the group
    verified syncs            POST /weight_checker {"action": "checksum"} -> {"checksums": {"dp0:pp0:pcp0:tp0:<name>": sha256}}

Sleep level 2 drops the weights instead of keeping a host copy (level 1): every push rewrites all of
them, so the copy would only cost host memory. vLLM has no "cuda_graph" tag (its graphs survive sleep),
so resuming ["kv_cache", "cuda_graph"] wakes "kv_cache". Plain HTTP, no vllm import.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Sequence
from typing import Any, Optional

from slime.engine import http_client
from slime.engine.client import EngineClient, EngineDigests
from slime.engine.http_client import EngineHTTPError
from slime.engine.vllm import cpu

SLEEP_LEVEL = 2
WAKE_TAGS = ("weights", "kv_cache")  # vLLM's CuMemAllocator tags
SCHEDULER_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")  # v1/metrics/loggers.py


# SGLang's pause modes (what the sync asks for) -> vLLM 0.32.0's (`vllm/v1/engine/async_llm.py: pause_generation`):
# "keep" freezes the running requests, which resume on /resume, as SGLang's "in_place" holds them.
# vLLM's fused modules of the dense families (`packed_modules_mapping` of its Llama, Qwen2 and Qwen3 classes): each
# holds its HF modules' weights concatenated along dim 0, in this order
PACKED_MODULES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
PAUSE_MODES = {"abort": "abort", "in_place": "keep"}


class VLLMClient(EngineClient):
    """Control calls of one vLLM 0.32.0 server at `url`; see the module docstring."""

    packed_modules = PACKED_MODULES
    digest_hash = "sha256"
    # `VocabParallelEmbedding` and `ParallelLMHead` hold pad_vocab_size(vocab) rows, the padding zero
    # (`model_executor/layers/vocab_parallel_embedding.py`: DEFAULT_VOCAB_PADDING_SIZE, `weight_loader`)
    vocab_padding = 64
    # the broadcast group's store prefix: vLLM's init_info carries no group name, so both sides use this one

    def __init__(self, url: str, *, timeout_s: float = 60.0):
        super().__init__(url, timeout_s=timeout_s)
        self._ipc_ready = False  # tensor mode: init_weight_transfer_engine {packed} sent on this client

    def _call(self, method: str, path: str, payload: Any = None, timeout: Optional[float] = None) -> Any:
        return http_client.call(method, self.url + path, payload, timeout=timeout or self.timeout_s)

    def is_healthy(self, path: str = "/health", timeout: float = 10.0) -> bool:
        return super().is_healthy(path, timeout)

    # ---- generation control ---------------------------------------------------------------------
    def flush_cache(self, max_attempts: int = 60, interval_s: float = 1.0) -> None:
        """POST /reset_prefix_cache until it reports success (it fails while running requests hold blocks)."""
        body = None
        for _ in range(max(1, max_attempts)):
            body = self._call("POST", "/reset_prefix_cache", {})
            if isinstance(body, dict) and body.get("success"):
                return
            time.sleep(interval_s)
        raise EngineHTTPError("POST", self.url + "/reset_prefix_cache", 200, f"still failing: {body}")

    def pause_generation(self, mode: Optional[str] = None) -> None:
        """POST /pause?mode=abort: in-flight requests end as aborted; new ones wait in the scheduler until /resume
        (0.32.0: `AsyncLLM.pause_generation` pauses `EngineCore`'s scheduler, the API server still queues them;
        tests/engine/vllm/test_vllm_server.py holds one across a pause). `mode` is SGLang's name (`PAUSE_MODES`)."""
        self._call("POST", "/pause?mode=" + PAUSE_MODES[mode or "abort"], {})

    def continue_generation(self) -> None:
        self._call("POST", "/resume", {})

    def abort_all(self) -> None:
        self._call("POST", "/abort_requests", {})

    def num_requests(self) -> int:
        """Requests in flight: the API server's count (GET /load; --enable-server-load-tracking, set by the engine),
        or 0 when its engine core schedules none (GET /metrics).

        vLLM 0.32.0's count can keep a request that has ended: in a 60-rollout run on a loaded 2-core machine it
        stayed at 1 for the whole 60 s wait after every one of the rollout's 256 requests had answered 200, and
        failed the run. It is taken back in a response's background task (`load_aware_call`,
        entrypoints/serve/utils/api_utils.py), which no step runs for a response never sent; a client that leaves
        mid-decode is taken back by `listen_for_disconnect` (tests/engine/vllm/test_vllm_server.py).
        """
        load = int(self._call("GET", "/load").get("server_load", 0))
        return min(load, self.num_scheduled()) if load > 0 else 0

    def num_scheduled(self) -> int:
        """Requests the engine core runs or queues (the `vllm:num_requests_running` and `vllm:num_requests_waiting`
        gauges of GET /metrics, summed over engines)."""
        text = str(self._call("GET", "/metrics"))
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if _is_scheduler_gauge(line)))

    def release_memory(self, tags: Optional[Sequence[str]] = None) -> None:
        """POST /sleep?level=2 (vLLM sleeps as a whole: weights and KV cache; `tags` must be all or None)."""
        self._call("POST", f"/sleep?level={SLEEP_LEVEL}", {})

    def resume_memory(self, tags: Optional[Sequence[str]] = None) -> None:
        """POST /wake_up?tags=... with the vLLM tags among `tags` (None: wake everything)."""
        wanted = list(WAKE_TAGS) if tags is None else [t for t in tags if t in WAKE_TAGS]
        unknown = [t for t in (tags or []) if t not in WAKE_TAGS and t != "cuda_graph"]
        if unknown:
            raise ValueError(f"vLLM has no memory tags {unknown}; its tags are {list(WAKE_TAGS)}")
        if wanted:
            self._call("POST", "/wake_up?" + urllib.parse.urlencode([("tags", t) for t in wanted]), {})

    def memory_gib(self) -> dict[str, float]:
        """{}: vLLM 0.32.0's HTTP API reports no memory in bytes (GET /metrics has `vllm:kv_cache_usage_perc`, a
        fraction of its KV blocks, and `vllm:cache_config_info`'s block counts; its weights are only logged)."""
        return {}

    def is_sleeping(self) -> bool:
        return bool(self._call("GET", "/is_sleeping")["is_sleeping"])

    # ---- what the sync classes read ------------------------------------------------------------
    def server_info(self) -> dict:
        """GET /server_info?config_format=json plus the two fields the sync classes read: `tp_size` (the
        server's workers, from GET /get_world_size: the ranks it adds to a weight-transfer group) and `dtype`."""
        info = self._call("GET", "/server_info?config_format=json")
        config = info.get("vllm_config") if isinstance(info.get("vllm_config"), dict) else {}
        world = self._call("GET", "/get_world_size?include_dp=true")["world_size"]
        dtype = str((config.get("model_config") or {}).get("dtype", "")).removeprefix("torch.")
        return {**info, "tp_size": int(world), "dtype": dtype}

    def get_weight_version(self) -> str:
        return str(self._call("GET", "/weight_info")["weight_version"])

    def weight_digests(self, timeout: float = 600.0) -> EngineDigests:
        """POST /weight_checker {"action": "checksum"} (vLLM's RL route, `entrypoints/rl/online/api_router.py`): the
        sha256 of every parameter's bytes by worker (`model_loader/weight_checksum.py:compute_tensor_digests`), keyed
        `dp<i>:pp<j>:pcp<k>:tp<l>:<name>`; whole only on a server of one worker. Its LoRA adapters are not parameters
        of the model, so they are not in it."""
        reply = self._call("POST", "/weight_checker", {"action": "checksum"}, timeout=timeout)
        by_worker: dict[str, dict[str, str]] = {}
        for key, digest in (reply.get("checksums") or {}).items():
            worker, _, name = key.rpartition(":")
            by_worker.setdefault(worker, {})[name] = digest
        if len(by_worker) != 1:
            return EngineDigests(hash="sha256", tensors=None, why_not=f"its weights are in {len(by_worker)} shards")
        return EngineDigests(hash="sha256", tensors=next(iter(by_worker.values())))

    def check_weights(self, action: str, timeout: float = 600.0) -> dict:
        raise NotImplementedError(
            "debug.check_weight_update_equal drives SGLang's /weights_checker (snapshot, reset_tensors, compare, "
            "checksum); vLLM has no such route, so this check is not available with rollout.engine=vllm"
        )

    # ---- weight updates ------------------------------------------------------------------------
    @staticmethod
    def prepare_disk_checkpoint(path: str) -> None:
        """A tied checkpoint gets its LM head as a tensor of its own (`slime.engine.vllm.cpu.untie`): a CPU server
        serves tied checkpoints untied, so that a reload loads (and repacks) the head; a tied server skips it."""
        cpu.untie(path)

    def update_weights_from_disk(
        self,
        path: str,
        weight_version: Optional[str] = None,
        load_format: Optional[str] = None,
        timeout: float = 600.0,
        *,
        flush_cache: bool = True,
    ) -> dict:
        """Every worker reloads the HF directory in place (`reload_weights` over /collective_rpc); it flushes no
        cache either way (`flush_cache` is SGLang's; the push's `flush_cache()` resets vLLM's prefix cache)."""
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}, "timeout": timeout}
        self._call("POST", "/collective_rpc", rpc, timeout=timeout)
        if weight_version is not None:
            self.update_weight_version(weight_version)
        return {"success": True}

    # ---- LoRA: vLLM's runtime adapter routes (VLLM_ALLOW_RUNTIME_LORA_UPDATING, entrypoints/serve/lora/) ------------
    def load_lora_adapter(self, name: str, path: str, *, timeout: float = 600.0) -> dict:
        """POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace}: the peft directory at `path` under `name`
        (`load_inplace`: an adapter of that name is replaced; its reply is text)."""
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
        return {"success": True, "message": self._call("POST", "/v1/load_lora_adapter", body, timeout=timeout)}

    def load_lora_adapter_from_tensors(self, name: str, config: dict, serialized_named_tensors, **_) -> dict:
        raise NotImplementedError(
            "vLLM 0.32.0 loads a LoRA adapter from a directory only (rollout.weight_sync.mode=disk)"
        )

    def unload_lora_adapter(self, name: str, *, timeout: float = 60.0) -> dict:
        return {"success": True, "message": self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name}, timeout)}

    def update_weight_version(self, version: str) -> None:
        self._call("POST", "/update_weight_version", {"new_version": str(version)})

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
        """Join the trainer's broadcast group (vLLM keeps one per server, so `group_name` is not sent)."""
        init = {"master_address": master_address, "master_port": int(master_port)}
        init.update(rank_offset=int(rank_offset), world_size=int(world_size), packed=False)
        return self._call("POST", "/init_weight_transfer_engine", {"init_info": init}, timeout=timeout)

    def destroy_weights_update_group(self, group_name: str, timeout: float = 60.0) -> dict:
        return self._call("POST", "/shutdown_weight_transfer_engine", {}, timeout=timeout)

    @staticmethod
    def trainer_weight_group(*, address: str, world_size: int, group_name: str, backend: str, timeout_s: float):
        """The trainer's end of the group `/init_weight_transfer_engine` joins (one per server, so `group_name`
        is not used): vLLM's own NCCL rendezvous (`slime.engine.vllm.weight_transfer`), or on CPU a gloo group under
        the fixed store prefix `weight_group_name`."""
        return _weight_transfer().VLLMTrainerEnd(
            address=address, world_size=world_size, backend=backend, timeout_s=timeout_s
        )

    def begin_weight_update(self) -> None:
        self._call("POST", "/start_weight_update", {}, timeout=600.0)

    def finish_weight_update(self, weight_version: Optional[str]) -> None:
        body = {} if weight_version is None else {"weight_version": str(weight_version)}
        self._call("POST", "/finish_weight_update", body, timeout=600.0)

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
        """POST /update_weights; the workers then receive the broadcasts in `names` order."""
        info = {"names": list(names), "dtype_names": list(dtypes), "shapes": [list(s) for s in shapes]}
        return self._call("POST", "/update_weights", {"update_info": info}, timeout=timeout)

    def update_weights_from_tensor(
        self,
        serialized_named_tensors: Sequence[str],
        *,
        load_format: str = "flattened_bucket",
        weight_version: Optional[str] = None,
        flush_cache: bool = False,
        timeout: float = 600.0,
    ) -> dict:
        """One flattened bucket (`slime.wire.bucket_codec` items, one per engine TP rank) as vLLM's packed IPC update."""
        if not self._ipc_ready:
            self._call("POST", "/init_weight_transfer_engine", {"init_info": {"packed": True}}, timeout=timeout)
            self._ipc_ready = True
        info = _weight_transfer().ipc_update_info(serialized_named_tensors)
        return self._call("POST", "/update_weights", {"update_info": info}, timeout=timeout)

    def __repr__(self) -> str:
        return f"VLLMClient({self.url})"


def _weight_transfer():
    """`slime.engine.vllm.weight_transfer`, loaded by the weight updates only (in the trainer's process)."""
    from slime.engine.vllm import weight_transfer  # torch: the driver and the rollout import this client, never torch

    return weight_transfer


def _is_scheduler_gauge(line: str) -> bool:
    """A sample line of one of SCHEDULER_GAUGES (`name{labels} value`), not of a longer name sharing its prefix."""
    return any(line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ") for name in SCHEDULER_GAUGES)
