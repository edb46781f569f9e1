"""Low-rank adapters on the policy (`model.lora.*`): what trains when the base model stays frozen."""

from __future__ import annotations

from dataclasses import dataclass, field

# The linear projections of a Llama/Qwen decoder layer, by their HF module names.
DECODER_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(kw_only=True)
class LoRAConfig:
    """LoRA (Hu et al. 2021) through peft: each target projection W (out x in) gains B·A, A (rank x in) and B
    (out x rank), scaled by alpha / rank; only A and B train. rank 0 (the default) trains every weight."""

    rank: int = 0  # r; 0: no adapters
    alpha: float = 16.0  # peft's lora_alpha: the adapter's output is scaled by alpha / rank
    dropout: float = 0.0  # on the adapter's input, training only
    target_modules: list[str] = field(default_factory=lambda: list(DECODER_PROJECTIONS))  # HF names, every layer
    init: str = "default"  # default: A Kaiming-uniform, B zero (peft's) | gaussian: A normal(0, 1/rank), B zero

    @property
    def enabled(self) -> bool:
        return self.rank > 0
