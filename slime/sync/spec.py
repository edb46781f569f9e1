"""The weight-sync modes' records (slime.registry): `rollout.weight_sync.mode=disk|tensor|distributed`."""

from slime.registry import Checks, Spec, WeightSyncFacts
from slime.sync.check import check_disk_unchosen, check_distributed, check_tensor

MODE = "rollout.weight_sync.mode"

SPECS = (
    Spec(
        seam=MODE,
        name="disk",
        target=".disk.DiskWeightSync",
        facts=WeightSyncFacts(cpu_blocker=None, adapter_sync=".adapter.DiskAdapterSync"),
        checks=Checks(check_unchosen=check_disk_unchosen),
    ),
    Spec(
        seam=MODE,
        name="tensor",
        target=".tensor.TensorWeightSync",
        facts=WeightSyncFacts(
            needs_tensor_handle_ranks=True,
            cpu_blocker="its IPC transfer and sleep mode need an accelerator",
            adapter_sync=".adapter.TensorAdapterSync",
            checks_adapters=True,
        ),
        checks=Checks(check=check_tensor),
    ),
    Spec(
        seam=MODE,
        name="distributed",
        target=".distributed.DistributedWeightSync",
        facts=WeightSyncFacts(),
        checks=Checks(check=check_distributed),
    ),
)
