"""A fake world for the run loop (slime.driver.loop): the rollout manager, trainer, weight pusher and tracker
as one object that logs what happens, in order; `eager_ray` makes the loop's Ray calls run at once."""

from __future__ import annotations

import time

from slime.driver import loop
from slime.rollout.setup import ROLLOUT_CLOCK
from slime.rollout.staleness import record_staleness
from slime.types import Sample


def eager_ray(monkeypatch) -> None:
    """`ray.get`/`ray.wait` in the loop take the fakes' eager results."""
    monkeypatch.setattr(loop.ray, "get", lambda ref: ref.value)
    monkeypatch.setattr(loop.ray, "wait", lambda refs, timeout=None: (refs, []))


class Ref:
    def __init__(self, value):
        self.value = value


class Remote:
    def __init__(self, fn):
        self.remote = lambda *args: Ref(fn(*args))


class FakeWorld:
    """The rollout manager, trainer, weight pusher and tracker, as fakes that log what happens, in order.

    A generation reads the engines' weight version when it starts (weights never change under it)."""

    def __init__(self, batch_size: int = 2):
        self.events: list[str] = []
        self.engine_version = None
        self.batch_size = batch_size
        self.generate, self.save = Remote(self._generate), Remote(self._save)
        self.evaluate = Remote(lambda rollout_id: {})
        self.logged: list[dict] = []

    def _generate(self, rollout_id):
        self.events.append(f"generate {rollout_id}")
        samples = [Sample(weight_versions=[str(self.engine_version)]) for _ in range(self.batch_size)]
        metrics = record_staleness(samples, trainer_version=rollout_id)
        return [], {**metrics, **dict(zip(ROLLOUT_CLOCK, (time.time(), time.time())))}, []

    def _save(self, rollout_id, root):
        self.events.append(f"save {rollout_id}")

    # the trainer (TrainGroup)
    def load_batch(self, rollout_id, batches):
        self.rollout_id = rollout_id

    def compute_log_probs(self, which):
        return {}

    def compute_advantages(self):
        return {}

    def train(self, update=True):
        self.events.append(f"train {self.rollout_id}")
        return {"perf": {}, "steps": [{"train/loss": 0.0}]}

    def save_checkpoint(self, rollout_id, root):
        pass

    # the weight pusher (WeightPush)
    def push(self, weight_version):
        self.events.append(f"push {weight_version}")
        self.engine_version = weight_version
        return {}

    def sync(self, weight_version, defer=True):
        self.push(weight_version)
        return {"rollout/engine_restarts": 0.0}

    def await_verification(self):
        return {}

    def recover(self, weight_version):
        return 0

    def before_train(self, rollout_id):
        return {}  # no colocated probe to score

    # the tracker (Tracker)
    def log(self, metrics, **steps):
        if "rollout" in steps and "train" not in steps:
            self.logged.append(metrics)

    def log_step(self, rollout_id, steps, metrics):
        self.logged.append(metrics)

    def stage_step(self, root, rollout_id, steps, metrics):
        pass

    def log_samples(self, rollout_id, preview):
        pass

    def on_save(self, root, plot=True):
        pass
