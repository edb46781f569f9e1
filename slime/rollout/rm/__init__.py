"""Built-in reward types (`rollout.rm_type`, REFERENCE.md §6.5): `fn(response, label, metadata) -> float | dict`."""
