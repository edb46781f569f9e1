"""The names `algo.kl_loss_type`, `algo.tis_mode` and `algo.tis_level` take, defined once beside the functions that
read them (standard library only: validation reads them without torch)."""

KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")  # slime.algo.kl.approx_kl
TIS_MODES: tuple[str, ...] = ("truncate", "icepop")  # slime.algo.off_policy.tis_weights
TIS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")  # slime.algo.off_policy.tis_log_ratio
