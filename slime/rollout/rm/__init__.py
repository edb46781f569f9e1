"""Built-in reward types (`rollout.rm_type`, docs/data-and-rewards.md#rewards):
`fn(response, label, metadata) -> float | dict`."""
