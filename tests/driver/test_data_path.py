"""Training data flows one way, by reference (docs/architecture.md#data-flow): the rollout manager's shards reach every
rank of their data-parallel shard, and the critic's values reach the actor (its returns the critic), without the driver
fetching them. A real Ray session: the rollout manager replays a dump (no engines), the ranks record what they get.
"""

from __future__ import annotations

import dataclasses

import pytest
import ray
import torch

from slime.driver.rollout_setup import rollout_setup
from slime.driver.train_group import TrainGroup
from slime.plan.derive import derive
from slime.plan.run_plan import plan_run
from slime.rollout.dumps import DUMP_DIR, save_rollout_data
from slime.rollout.manager.actor import ACTOR_OPTIONS, RolloutManager, RolloutResult
from slime.rollout.postprocess import split_for_data_parallel
from slime.train.base import TrainBackend
from slime.train.layout import RankLayout
from slime.types import Sample, SampleStatus, TrainBatch
from tests.helpers.compose import typed_config
from tests.helpers.train_ranks import RecordingBackend, critic_values, recording_group

LAYOUT = RankLayout(dp=2, tp=2)  # ranks 0, 1 train shard 0; ranks 2, 3 shard 1
GROUPS, PER_GROUP, STEPS = 4, 2, 2


@pytest.fixture(scope="module")
def ray_local():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _samples() -> list[list[Sample]]:
    """GROUPS groups of PER_GROUP samples, each with its own response length (1..8 tokens)."""
    groups = []
    for g in range(GROUPS):
        group = []
        for j in range(PER_GROUP):
            index, n = g * PER_GROUP + j, 1 + (g * PER_GROUP + j) % 8
            sample = Sample(group_index=g, index=index, tokens=list(range(3 + n)), reward=float(j), label="x")
            sample.response_length, sample.loss_mask, sample.status = n, [1] * n, SampleStatus.COMPLETED
            sample.rollout_log_probs = [-0.5] * n
            group.append(sample)
        groups.append(group)
    return groups


@pytest.fixture(scope="module")
def manager(ray_local, tmp_path_factory):
    """The real rollout manager as a Ray actor, replaying one dumped rollout (debug.load_rollout_data)."""
    run_dir = tmp_path_factory.mktemp("run")
    save_rollout_data(run_dir, 0, _samples())
    cfg = typed_config([f"rollout.batch_size={GROUPS}", f"rollout.n_samples_per_prompt={PER_GROUP}"])
    setup = rollout_setup(cfg, plan_run(cfg, derive(cfg)))
    setup = dataclasses.replace(
        setup,
        fleet=dataclasses.replace(setup.fleet, specs=[]),  # no engines
        load_rollout_data=str(run_dir / DUMP_DIR),
        dp_size=LAYOUT.dp,
        global_batch_size=GROUPS * PER_GROUP // STEPS,
        num_steps_per_rollout=STEPS,
    )
    actor = ray.remote(**ACTOR_OPTIONS)(RolloutManager).remote(setup, [])
    ray.get(actor.start.remote())
    return actor


@pytest.fixture(scope="module")
def groups(ray_local) -> dict[str, TrainGroup]:
    """An actor and a critic group of recording ranks, laid out as LAYOUT."""
    return {"actor": recording_group(LAYOUT), "critic": recording_group(LAYOUT)}


@pytest.fixture
def driver_gets(monkeypatch) -> list:
    """Every value the driver's `ray.get` returns, from here on."""
    seen, real_get = [], ray.get

    def get(refs, **kwargs):
        value = real_get(refs, **kwargs)
        seen.append(value)
        return value

    monkeypatch.setattr(ray, "get", get)
    return seen


def _holds_training_data(value) -> bool:
    """A TrainBatch, or per-sample token columns (a list of lists of floats), anywhere inside `value`."""
    if isinstance(value, TrainBatch):
        return True
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, list) and v and isinstance(v[0], float) for v in value):
            return True
        return any(_holds_training_data(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_training_data(v) for v in value.values())
    return False


class _CallLog:
    """Stands in for a rank's actor handle: records the arguments of each `call` and forwards it."""

    def __init__(self, handle, log: list):
        self.handle, self.log = handle, log
        self.call = self
        self.put_owned = handle.put_owned

    def remote(self, *args, **kwargs):
        self.log.append(args)
        return self.handle.call.remote(*args, **kwargs)


def _received(group) -> list[dict]:
    return ray.get([actor.call.remote(RecordingBackend.received) for actor in group.actors])


def test_each_shard_reaches_its_ranks_as_one_object_the_driver_never_fetches(manager, groups, driver_gets):
    logs = [[] for _ in groups["actor"].actors]
    group = TrainGroup(LAYOUT, [_CallLog(actor, log) for actor, log in zip(groups["actor"].actors, logs)])

    result = ray.get(manager.generate.remote(0))
    assert isinstance(result, RolloutResult) and len(result.shards) == LAYOUT.dp
    assert all(isinstance(ref, ray.ObjectRef) for ref in result.shards)
    group.load_batch(0, result.shards)

    # every rank got its shard's reference itself (so the ranks of one shard read one object) ...
    for rank, log in enumerate(logs):
        assert log == [(TrainBackend.load_batch, 0, result.shards[LAYOUT.shard_of(rank)])]
    assert not any(_holds_training_data(value) for value in driver_gets)
    # ... and holds that shard: the manager's split, the same samples in the same order
    samples = [s for g in _samples() for s in g]
    rewards = [s.scalar_reward() for s in samples]
    expected = split_for_data_parallel(
        samples, rewards, rewards, step_sizes=[GROUPS * PER_GROUP // STEPS] * STEPS, dp_size=LAYOUT.dp
    )
    received = _received(group)
    for rank, got in enumerate(received):
        want = expected[LAYOUT.shard_of(rank)]
        assert got["batch"].sample_indices == want.sample_indices and got["batch"].tokens == want.tokens
        assert got["batch"].step_ids == want.step_ids
    assert received[0]["batch"].sample_indices == [0, 2, 4, 6]  # round-robin within each step
    assert received[2]["batch"].sample_indices == [1, 3, 5, 7]


def test_critic_values_and_actor_returns_cross_by_reference(manager, groups, driver_gets):
    actor, critic = groups["actor"], groups["critic"]
    shards = ray.get(manager.generate.remote(0)).shards
    actor.load_batch(0, shards)
    critic.load_batch(0, shards)

    values = critic.compute_values()
    assert all(isinstance(ref, ray.ObjectRef) for ref in values) and len(values) == LAYOUT.dp
    actor.set_column("values", values)
    actor.compute_advantages()
    critic.set_column("returns", actor.get_column("returns"))
    assert not any(_holds_training_data(value) for value in driver_gets)

    as_column = lambda lists: [torch.tensor(v, dtype=torch.float32).tolist() for v in lists]  # noqa: E731
    for got_actor, got_critic in zip(_received(actor), _received(critic)):
        batch = got_actor["batch"]
        produced = [critic_values(i, n) for i, n in zip(batch.sample_indices, batch.response_lengths)]
        assert got_actor["columns"]["values"] == as_column(produced)  # what the critic computed, on every rank
        returns = as_column([[v + 1 for v in sample] for sample in produced])
        assert got_actor["columns"]["returns"] == returns
        assert got_critic["columns"] == {"returns": returns}
