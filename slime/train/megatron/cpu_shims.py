"""Everything megatron-core needs to run on CPU through gloo, in one place (docs/architecture.md#megatron-on-cpu).

megatron-core assumes CUDA in a handful of sites (current device, synchronize, the CUDA RNG tracker,
`device="cuda"` tensors in the schedules and the optimizer, `torch.cuda.*Tensor` type names in grad
clipping and the distributed optimizer, CUDA streams in MoE's token dispatcher). `activate(device)` patches them for this process, only when
`device == "cpu"`; on CUDA it does nothing. The patches are process-wide (a training rank is its own
process) and idempotent; `seed_rng_tracker` replaces `model_parallel_cuda_manual_seed` on CPU.
"""

from __future__ import annotations

import contextlib

import torch
from megatron.core.tensor_parallel import random as mrandom
from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
from torch.overrides import TorchFunctionMode

_MARK = "_slime_megatron_cpu_shims"  # attribute on torch.cuda: set once the shims are active


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)  # a bare CUDA ordinal


class CudaToCpu(TorchFunctionMode):
    """(D) `device="cuda"`, `.cuda()` and `.to("cuda")` land on CPU; (E) `Tensor.type()` reports the
    `torch.cuda.*` name, which megatron's grad clipping and distributed optimizer assert on."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _Event:
    """(F) A CUDA event stand-in: CPU work is complete when it is issued."""

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream:
    """(F) A CUDA stream stand-in: MoE's all-to-all dispatcher copies split sizes on a side stream."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None) -> _Event:
        return event or _Event()

    def synchronize(self) -> None:
        pass


def _all_to_all_with_list_splits(all_to_all_single):
    """(G) MoE's all-to-all passes its split sizes as tensors (on CUDA they became numpy arrays in a
    device-to-host copy); gloo's binding takes lists."""

    def call(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
        as_list = lambda sizes: sizes.tolist() if hasattr(sizes, "tolist") else sizes  # noqa: E731
        return all_to_all_single(
            output, input, as_list(output_split_sizes), as_list(input_split_sizes), *args, **kwargs
        )

    return call


def activate(device: str) -> None:
    """Apply the CPU shims for this process when `device == "cpu"` (no-op on CUDA, or when active)."""
    if device != "cpu" or getattr(torch.cuda, _MARK, False):
        return
    torch.cuda.current_device = lambda: torch.device("cpu")  # (A) megatron allocates on the current device
    torch.cuda.synchronize = lambda *args, **kwargs: None  # (B) the torch_dist writer synchronizes
    default_stream = _Stream()  # (F) streams and events: no-ops
    torch.cuda.Stream, torch.cuda.Event = _Stream, _Event
    torch.cuda.current_stream = lambda *args, **kwargs: default_stream
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    torch.distributed.all_to_all_single = _all_to_all_with_list_splits(torch.distributed.all_to_all_single)  # (G)
    mode = CudaToCpu()
    mode.__enter__()  # (D, E) for the life of the process; the mode object lives on torch's mode stack
    setattr(torch.cuda, _MARK, True)


class CpuRNGStatesTracker:
    """(C) megatron's RNG tracker over CPU generator states (built on its own class at first use)."""

    @staticmethod
    def create():
        class _Tracker(CudaRNGStatesTracker):
            def add(self, name, seed):
                self._is_initialized = True
                if seed in self.seeds_ or name in self.states_:
                    raise RuntimeError(f"rng state {name} (seed {seed}) already exists")
                self.seeds_.add(seed)
                self.states_[name] = torch.Generator().manual_seed(seed).get_state()

            @contextlib.contextmanager
            def fork(self, name="model-parallel-rng"):
                if name not in self.states_:
                    raise RuntimeError(f"rng state {name} is not added")
                outer = torch.get_rng_state()
                torch.set_rng_state(self.states_[name])
                try:
                    yield
                finally:
                    self.states_[name] = torch.get_rng_state()
                    torch.set_rng_state(outer)

        return _Tracker()


def seed_rng_tracker(seed: int, *, tp_rank: int, ep_rank: int, etp_rank: int) -> None:
    """Megatron's three RNG streams on CPU generators, seeded as `model_parallel_cuda_manual_seed` seeds
    them: data parallel `seed`, model parallel `seed + 2718 + tp_rank`, expert `seed + 1024 + 100·ep + etp`."""
    tracker = CpuRNGStatesTracker.create()
    # (H) activation recomputation saves and restores the "CUDA" state beside the CPU one: the CPU one is all
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank)
