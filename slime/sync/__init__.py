"""Weight synchronisation from the trainer to the rollout engines."""
