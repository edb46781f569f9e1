"""The driver process: launch and the front door, Ray start-up, placement, the training groups, the loop and the phase
events it publishes (the console, the watchdog, checkpoint bookkeeping and fault injection follow them), weight
pushes, result.json. The rollout manager's process is slime.rollout.manager."""
