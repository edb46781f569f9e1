"""The weight-transfer routes of the fake vLLM server (tests/fakes/fake_vllm.py): vLLM 0.32.0's RL routes over
its own weight-transfer engine classes, with only the data movement faked (it needs an accelerator).

    POST /init_weight_transfer_engine {"init_info"}, /start_weight_update, /update_weights {"update_info"},
         /finish_weight_update {"weight_version"}, /shutdown_weight_transfer_engine,
         /update_weight_version {"new_version"}

The server keeps what each of vLLM's workers keeps (`vllm/v1/worker/gpu_worker.py`: `Worker`): the engine
`WeightTransferEngineFactory.create_engine` makes for `--weight-transfer-config` (none without it) and whether
a weight update is active; the session rules and their messages are Worker's (`init_weight_transfer_engine`,
`start_weight_update`, `update_weights`, `finish_weight_update`, `shutdown_weight_transfer_engine`).
`init_info` and `update_info` are parsed by that engine (`parse_init_info`, `parse_update_info`: vLLM's typed
infos and their checks; pickled IPC handles need VLLM_ALLOW_INSECURE_SERIALIZATION=1). Faked, as a CPU
vLLM's transfer engines need an accelerator:

- nccl: every worker of the server (`world_size_across_dp` of them) joins the trainer's group as rank
  `rank_offset + i` (`nccl_common.worker_init_process_group`), over gloo (`slime.wire.bare_group`, one store prefix
  for the group, as `VLLMClient` uses) instead of PyNccl; unpacked transfers only: one broadcast per tensor
  in the listed order (`NCCLWeightTransferEngine.receive_weights` with packed=False).
- ipc: packed transfers only; the handle dict's key is "cpu" where vLLM's is the GPU's UUID, its value
  (a /dev/shm path, byte offset, bytes) where vLLM's is CUDA IPC rebuild args; the buffer is cut by
  `tensor_sizes` with vLLM's own `packed_tensor.unpack_tensor` (`packed_ipc_consumer`).

Mixed into the fake server class, which provides `cli`, `parallel` (vLLM's ParallelConfig for the CLI's
sizes), `scheduler`, `receiver` and `sleeping_tags`. Handlers return (status, JSON body); worker failures raise
`WorkerError`, answered as vLLM's API server answers a failed collective_rpc.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import torch

from slime.wire import bare_group

GROUP = "vllm-weight-transfer"  # the store prefix of the trainer's group (slime.engine.vllm.weight_transfer)


def vllm_layout(model: torch.nn.Module) -> SimpleNamespace:
    """The hf model's parameters as vLLM's Qwen3 class holds them, behind the `named_parameters()` that vLLM's
    digests read: each group of its `packed_modules_mapping` (`model_executor/models/qwen3.py:Qwen3ForCausalLM`)
    concatenated along dim 0 in the mapping's order (`QKVParallelLinear`, `MergedColumnParallelLinear` at tp 1), the
    embedding and LM head padded to vLLM's vocabulary size (`layers/vocab_parallel_embedding.py`: `pad_vocab_size`,
    and `weight_loader` zeroes the padding), the rest as they are."""
    from vllm.model_executor.layers.vocab_parallel_embedding import pad_vocab_size
    from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

    mapping = Qwen3ForCausalLM.packed_modules_mapping
    part_of = {part: (fused, i) for fused, parts in mapping.items() for i, part in enumerate(parts)}
    params: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[int, torch.Tensor]] = {}
    for name, param in model.named_parameters():
        module, _, leaf = name.rpartition(".")
        owner, _, short = module.rpartition(".")
        if short in part_of:
            group, index = part_of[short]
            fused.setdefault(f"{owner}.{group}.{leaf}", {})[index] = param.detach()
        else:
            params[name] = param.detach()
    params.update({name: torch.cat([parts[i] for i in sorted(parts)]) for name, parts in fused.items()})
    for name in ("model.embed_tokens.weight", "lm_head.weight"):  # VocabParallelEmbedding's rows, padding zero
        if name in params:
            rows = params[name]
            padded = rows.new_zeros(pad_vocab_size(rows.shape[0]), rows.shape[1])
            padded[: rows.shape[0]] = rows
            params[name] = padded
    return SimpleNamespace(named_parameters=lambda: iter(params.items()))


class WorkerError(RuntimeError):
    """An exception inside a worker's weight-transfer call (the API server answers 500)."""


class WeightTransferRoutes:
    """State and handlers of the server's weight-transfer engine (see the module docstring)."""

    def init_transfer_state(self) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

        self.transfer_engine = None
        if self.cli.weight_transfer_config is not None:  # vLLM's worker makes it when it loads the model
            config = SimpleNamespace(parallel_config=self.parallel, model_config=None)
            self.transfer_engine = WeightTransferEngineFactory.create_engine(
                self.cli.weight_transfer_config, config, torch.device("cpu"), self.model
            )
        self.updating = False  # Worker._weight_update_active
        self.groups: list = []  # nccl: the trainer's group, one member per worker

    def transfer_handlers(self, rl: str) -> dict:
        return {
            rl + "init_weight_transfer_engine": self.init_transfer,
            rl + "shutdown_weight_transfer_engine": self.shutdown_transfer,
            rl + "start_weight_update": self.start_update,
            rl + "update_weights": self.update_weights,
            rl + "finish_weight_update": self.finish_update,
            rl + "update_weight_version": self.update_weight_version,
            rl + "weight_checker": self.weight_checker,
        }

    def _engine(self):
        if self.transfer_engine is None:  # Worker._check_weight_transfer_engine
            raise WorkerError(
                "Weight transfer not configured. Please set weight_transfer_config to enable weight transfer."
            )
        return self.transfer_engine

    @property
    def _backend(self) -> str:
        return self.cli.weight_transfer_config.backend

    async def init_transfer(self, http, init_info: dict):
        engine = self._engine()
        try:
            info = engine.parse_init_info(init_info)
        except ValueError as exc:
            raise WorkerError(str(exc)) from exc
        if self._backend == "ipc":
            engine.init_transfer_engine(info)  # vLLM's: records `packed`
        elif self._backend == "nccl":
            if info.packed or info.master_address is None:
                raise NotImplementedError("the fake vLLM server joins NCCL groups by TCP store, unpacked, only")
            self._drop_groups()
            await self._join(info)
        else:
            raise NotImplementedError(f"the fake vLLM server fakes the nccl and ipc backends, not {self._backend}")
        return 200, {"message": "Weight transfer initialized"}

    async def _join(self, info) -> None:
        address, port, world = str(info.master_address), int(info.master_port), int(info.world_size)

        def join(rank: int) -> bare_group.WeightGroup:
            store = bare_group.create_store(address, port, world, is_master=False, timeout_s=600)
            return bare_group.WeightGroup(
                store, rank=rank, world_size=world, group_name=GROUP, backend="gloo", timeout_s=600, address=address
            )

        ranks = [info.rank_offset + i for i in range(self.parallel.world_size_across_dp)]
        self.groups = await asyncio.gather(*(asyncio.to_thread(join, rank) for rank in ranks))

    def _drop_groups(self) -> None:
        groups, self.groups = self.groups, []
        for group in groups:
            group.close()

    async def shutdown_transfer(self, http):
        if self.updating:
            raise WorkerError("Cannot release a trainer connection during a weight update")
        if self.transfer_engine is not None:
            self._drop_groups()
            self.transfer_engine.shutdown()
        return 200, {"message": "Weight transfer shut down"}

    async def start_update(self, http):
        self._engine()
        if self.updating:
            raise WorkerError(
                "start_weight_update called while a weight update is already active. Call finish_weight_update first."
            )
        self.updating = True
        return 200, {"message": "Weight update started"}

    async def update_weights(self, http, update_info):
        engine = self._engine()
        if not self.updating:
            raise WorkerError("start_weight_update must be called before update_weights.")
        try:
            tensors = await self._receive(engine, update_info)
        except Exception as exc:  # Worker.update_weights ends the session on any failure
            self.updating = False
            raise WorkerError(str(exc)) from exc
        await self.scheduler.run_exclusive(self.receiver.load, tensors, None)
        return 200, {"message": "Weights updated"}

    async def _receive(self, engine, update_info) -> dict[str, torch.Tensor]:
        # a list holds one info per worker, indexed by its global rank (Worker.update_weights)
        workers = self.parallel.world_size_across_dp
        infos = [
            engine.parse_update_info(update_info[i] if isinstance(update_info, list) else update_info)
            for i in range(workers)
        ]
        if "weights" in self.sleeping_tags:  # on a GPU the weights' memory is unmapped: the copy would fault
            raise RuntimeError("weights are asleep: wake_up(tags=['weights']) before updating")
        if self._backend == "ipc":
            return self._open_packed_ipc(engine, infos[0])
        if not self.groups:  # NCCLWeightTransferEngine.receive_weights
            raise RuntimeError("NCCL weight transfer not initialized. Call init_transfer_engine() first.")
        received = await asyncio.gather(
            *(asyncio.to_thread(self._broadcasts, group, info) for group, info in zip(self.groups, infos))
        )
        return received[0]  # every worker got the same broadcasts

    @staticmethod
    def _broadcasts(group, info) -> dict[str, torch.Tensor]:
        out = {}
        for name, dtype_name, shape in zip(info.names, info.dtype_names, info.shapes):
            out[name] = torch.empty(shape, dtype=getattr(torch, dtype_name))
            group.broadcast(out[name])
        return out

    @staticmethod
    def _open_packed_ipc(engine, info) -> dict[str, torch.Tensor]:
        from vllm.distributed.weight_transfer.packed_tensor import unpack_tensor

        if not engine.packed:
            raise NotImplementedError("unpacked IPC handles are CUDA tensors; the fake opens packed buffers only")
        if info.tensor_sizes is None:  # IPCWeightTransferEngine.receive_weights
            raise ValueError("`tensor_sizes` is required when packed=True")
        if "cpu" not in info.ipc_handles:  # packed_ipc_consumer, with "cpu" for the GPU's UUID
            raise ValueError(f"IPC handle not found for GPU UUID cpu. Available UUIDs: {list(info.ipc_handles)}")
        path, offset, nbytes = info.ipc_handles["cpu"]
        buffer = torch.from_file(path, shared=False, size=offset + nbytes, dtype=torch.uint8)[offset:]
        buffer = buffer[: sum(info.tensor_sizes)]
        dtypes = [getattr(torch, name) for name in info.dtype_names]
        return {
            name: t.clone() for name, t in unpack_tensor(buffer, info.names, info.shapes, dtypes, info.tensor_sizes)
        }

    async def finish_update(self, http, weight_version=None):
        self._engine()
        if not self.updating:
            raise WorkerError("finish_weight_update called without a matching start_weight_update.")
        self.updating = False
        if weight_version is not None:  # AsyncLLM.finish_weight_update
            self.scheduler.weight_version = weight_version
        return 200, {"message": "Weight update finished"}

    async def weight_checker(self, http, action: str, baseline=None):
        """vLLM's `weight_checker` route (`entrypoints/rl/online/api_router.py`) over every worker's
        `compute_weight_checksums` (`v1/worker/gpu_worker.py`): vLLM's own `compute_tensor_digests` of the model as
        vLLM holds it (`vllm_layout`), keyed by each worker's `dp:pp:pcp:tp` prefix (every worker of the fake holds
        the whole model); "reset" is every worker's `reset_weights`: vLLM's own `zero_weights` of the model."""
        from vllm.model_executor.model_loader.weight_checksum import compute_tensor_digests, zero_weights

        if action == "reset":
            await self.scheduler.run_exclusive(zero_weights, self.model)
            return 200, {"status": "reset"}
        if action == "compare" and baseline is None:
            return 400, {"detail": "action='compare' requires a 'baseline' object"}
        digests = await self.scheduler.run_exclusive(lambda: compute_tensor_digests(vllm_layout(self.model)))
        checksums = {
            f"dp0:pp0:pcp0:tp{tp}:{name}": digest
            for tp in range(self.parallel.world_size)
            for name, digest in digests.items()
        }
        if action == "checksum":
            return 200, {"checksums": checksums}
        mismatches = sorted(k for k in checksums.keys() | baseline.keys() if checksums.get(k) != baseline.get(k))
        return 200, {"match": not mismatches, "mismatches": mismatches}

    async def update_weight_version(self, http, new_version: str):
        self.scheduler.weight_version = new_version
        return 200, {"success": True, "new_version": new_version}
