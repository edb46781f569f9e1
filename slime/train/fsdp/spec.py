"""The fsdp training backend's record (slime.registry): `parallelism.backend=fsdp`."""

from slime.registry import Checks, Spec, TrainBackendFacts
from slime.train.fsdp.check import check, check_unchosen
from slime.train.fsdp.config import FSDPBackendOptions

SPECS = (
    Spec(
        seam="parallelism.backend",
        name="fsdp",
        target={"actor": ".backend.FSDPBackend", "critic": ".critic.FSDPCritic"},
        facts=TrainBackendFacts(
            kind="PyTorch FSDP2 over a transformers model",
            fully_sharded_state=True,
            frozen_models_on_gpu=True,
            bf16_lora_base=("fsdp.mixed_precision", "fsdp2"),
        ),
        checks=Checks(check=check, check_unchosen=check_unchosen),
        config=FSDPBackendOptions,
    ),
)
