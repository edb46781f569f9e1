"""The SGLang engine's record (slime.registry): `rollout.engine=sglang`."""

from slime.engine.sglang.check import check, check_unchosen
from slime.engine.sglang.config import SGLangOptions
from slime.registry import Checks, EngineFacts, Spec

SPECS = (
    Spec(
        seam="rollout.engine",
        name="sglang",
        target=".engine.SGLangEngine",
        facts=EngineFacts(
            kind="SGLang servers",
            memory_fraction_key="sglang.mem_fraction_static",
            memory_fraction_default=0.8,
            lora_adapter_modes=("tensor", "disk"),
            gpu_weight_checksums=True,
            node_span_flags=("--nnodes", "--node-rank", "--dist-init-addr"),
        ),
        checks=Checks(check=check, check_unchosen=check_unchosen),
        config=SGLangOptions,
    ),
)
