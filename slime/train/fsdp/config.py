"""The fsdp backend's options section, `parallelism.fsdp`: what its spec (slime/train/fsdp/spec.py) adds to the
run's schema (slime/run_schema.py). Torch-free: the standard library only."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class FSDPOptions:
    """Options of the fsdp backend alone (`parallelism.fsdp.*`); CUDA runs, where FSDP2 wraps the model."""

    # bf16 runs: "fsdp2" keeps fp32 parameter shards and optimizer state and computes in bf16 through
    # FSDP2's mixed-precision policy; "autocast" computes fp32 parameters under torch.autocast.
    mixed_precision: str = "fsdp2"
    compile: bool = True  # torch.compile each decoder layer (fused norms, RoPE and SwiGLU); CUDA only
    cpu_offload: bool = False  # FSDP2's CPU offload: parameter shards, gradients and optimizer state in host memory


@dataclass(kw_only=True)
class FSDPBackendOptions:
    """The keys the fsdp backend adds to `parallelism`."""

    fsdp: FSDPOptions = field(default_factory=FSDPOptions)
