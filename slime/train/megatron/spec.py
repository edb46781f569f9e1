"""The megatron training backend's record (slime.registry): `parallelism.backend=megatron`."""

from slime.registry import Checks, Spec, TrainBackendFacts
from slime.train.megatron.config import MegatronOptions
from slime.train.megatron.config_check import check, check_unchosen

SPECS = (
    Spec(
        seam="parallelism.backend",
        name="megatron",
        target={"actor": ".backend.MegatronBackend", "critic": ".critic.MegatronCritic"},
        facts=TrainBackendFacts(kind="Megatron-core GPTModel", full_recompute=("recompute.granularity", "full")),
        checks=Checks(check=check, check_unchosen=check_unchosen),
        config=MegatronOptions,
    ),
)
