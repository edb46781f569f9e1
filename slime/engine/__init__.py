"""Rollout engines behind one interface (`base.HTTPEngine`, registry `base.ENGINES`), plus the router.

Kept import-light: nothing here imports torch, ray or sglang.
"""
