"""FP8 training of the fsdp backend (`parallelism.fp8`): torchao's float8 training swaps each decoder layer's
`nn.Linear` for its `Float8Linear`, whose three matmuls (forward, input gradient, weight gradient) cast their operands
to float8 with one dynamic scale per tensor (torchao's default "tensorwise" recipe: 1.29x bf16's tokens/s on the
Qwen3-1.7B shape's projections and MLP on one H200, where "rowwise" gave 0.87x). The weights, their gradients and
the optimizer's state keep their precision, so checkpoints, weight syncs and the engines see the tensors of a bf16
run. The embeddings, the norms, attention and the LM head stay in bf16.

Float8 matmuls need each dimension a multiple of FLOAT8_MULTIPLE: a linear whose widths are not stays in bf16, and
the rank pads each packed micro-batch's tokens to such a multiple (`packing.pack(multiple_of=...)`). On a CPU, which
has no float8 matmul, torchao emulates them (the same casts and scales, computed in high precision): for tests.
"""

from __future__ import annotations

import torch
from torch import nn

FLOAT8_MULTIPLE = 16
FLOAT8_CAPABILITY = (8, 9)  # CUDA compute capability with float8 tensor cores (Ada, Hopper and later)


def apply_float8(model: nn.Module, *, device: torch.device) -> list[str]:
    """Convert the decoder layers' linears of `model` (a transformers causal LM, before FSDP wraps or compiles it)
    to torchao's Float8Linear; returns the converted modules' names. Raises RuntimeError on a GPU without float8
    tensor cores."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # the fp8 extra: only here

    if device.type == "cuda" and torch.cuda.get_device_capability(device) < FLOAT8_CAPABILITY:
        raise RuntimeError(
            f"parallelism.fp8=true: {torch.cuda.get_device_name(device)} (compute capability "
            f"{torch.cuda.get_device_capability(device)}) has no float8 matmuls; they need {FLOAT8_CAPABILITY} or "
            "later (H100, L40S, ...). Set parallelism.fp8=false."
        )

    def converted(module: nn.Module, name: str) -> bool:
        return (
            isinstance(module, nn.Linear)
            and ".layers." in f".{name}"
            and module.in_features % FLOAT8_MULTIPLE == 0
            and module.out_features % FLOAT8_MULTIPLE == 0
        )

    config = Float8LinearConfig(emulate=device.type != "cuda")
    convert_to_float8_training(model, config=config, module_filter_fn=converted)
    return [name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"]
