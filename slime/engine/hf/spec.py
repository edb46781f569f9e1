"""The built-in engine's record (slime.registry): `rollout.engine=hf`."""

from slime.engine.hf.check import check
from slime.engine.hf.config import HFEngineOptions
from slime.registry import Checks, EngineFacts, Spec

SPECS = (
    Spec(
        seam="rollout.engine",
        name="hf",
        target=".engine.HFEngine",
        facts=EngineFacts(
            kind="built-in transformers server",
            lora_adapter_modes=("tensor", "disk"),
            applies_weight_deltas=True,
            dtype_key="hf.dtype",
            reuses_tensor_buffers=True,
        ),
        checks=Checks(check=check),
        config=HFEngineOptions,
    ),
)
