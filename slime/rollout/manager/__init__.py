"""The rollout manager's process: the Ray actor (actor.py) owning the router(s), the engines (engine_fleet.py, started
on their bundles by engine_nodes.py, restarted by engine_recovery.py), the data sources and rewards; and what the
driver shares with it, being the layer above: the bundles an actor is placed on (bundles.py), the errors naming a dead
router or engine (deaths.py), how a Ray worker logs (worker_logging.py) and arms its stack dump (stack_dump.py)."""
