"""Metric sinks: JSONL (ground truth), wandb, the console progress display and the reward plot."""
