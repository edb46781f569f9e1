"""The driver: Ray start-up, placement, actor groups and the training loop."""
