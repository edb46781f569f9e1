"""Low-rank adapters on the policy (`model.lora.*`): what trains when the base model stays frozen."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

# The linear projections of a Llama/Qwen decoder layer, by their HF module names.
DECODER_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# model.lora.init -> peft's `init_lora_weights`
LORA_INITS = {"default": True, "gaussian": "gaussian"}
# The hidden-size RMSNorm gains `train_params` may name.
NORM_GAIN = re.compile(r"^model\.(norm|layers\.(\d+)\.(input_layernorm|post_attention_layernorm))\.weight$")


@dataclass(kw_only=True)
class LoRAConfig:
    """LoRA (Hu et al. 2021) through peft: each target projection W (out x in) gains B·A, A (rank x in) and B
    (out x rank), scaled by alpha / rank; only A and B train. rank 0 (the default) trains every weight."""

    rank: int = 0  # r; 0: no adapters
    alpha: float = 16.0  # peft's lora_alpha: the adapter's output is scaled by alpha / rank
    dropout: float = 0.0  # on the adapter's input, training only
    target_modules: list[str] = field(default_factory=lambda: list(DECODER_PROJECTIONS))  # HF names, every layer
    init: str = "default"  # default: A Kaiming-uniform, B zero (peft's) | gaussian: A normal(0, 1/rank), B zero
    lr: Optional[float] = None  # the optimizer's peak learning rate with adapters; None: train.lr
    # Weight sync: False moves the adapter alone (engines serve it as a LoRA adapter: SGLang's --enable-lora, vLLM's,
    # the hf engine's; rollout.weight_sync.mode=tensor or disk), the train_params beside it into the engines' base;
    # True merges it into the base and moves every weight (engines without LoRA serving, other modes)
    sync_merged: bool = False
    export_merged: bool = False  # checkpoint.save_hf: also the merged HF model in <dir>/merged (always: the adapter)
    # RMSNorm gains trained whole beside the adapters, by HF name (`model.norm.weight`, a layer's
    # `model.layers.<i>.input_layernorm.weight` / `post_attention_layernorm.weight`): the final norm's frozen gain
    # caps how sharp the policy's logits can get through a frozen LM head
    train_params: list[str] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def synced_alone(self) -> bool:
        """The engines serve the adapter and each sync moves it alone (`sync_merged` off)."""
        return self.enabled and not self.sync_merged

    def adapter_config(self) -> dict[str, Any]:
        """peft's adapter_config.json of these adapters (the fields `peft.LoraConfig.to_dict` writes that an engine
        reads: SGLang's `lora/lora_config.py` takes r, lora_alpha and target_modules), without importing peft."""
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": sorted(self.target_modules),
            "bias": "none",
            "use_rslora": False,
            "use_dora": False,
            "modules_to_save": None,
        }

    def parameter_count(self, model: Any) -> int:
        """Trainable parameters on `model` (the ModelConfig holding them): the adapters', and hidden_size per trained
        gain."""
        return self.adapter_parameter_count(model) + len(self.train_params) * model.hidden_size

    def adapter_parameter_count(self, model: Any) -> int:
        """Parameters of the adapters alone: every layer's targets, rank x (in + out) each."""
        h, q = model.hidden_size, model.num_attention_heads * model.kv_channels
        kv, f = model.num_query_groups * model.kv_channels, model.ffn_hidden_size
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
        shapes |= {"gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
        return model.num_layers * sum(self.rank * sum(shapes[name]) for name in self.target_modules)
