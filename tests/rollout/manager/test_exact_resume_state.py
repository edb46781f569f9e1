"""What the rollout manager keeps with a checkpoint: the data source's state and this actor's generators
(Python, NumPy, torch), which a user's rollout hooks may draw from; a load puts both back."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch

from slime.driver.rollout_setup import rollout_setup
from slime.plan.derive import derive
from slime.plan.run_plan import plan_run
from slime.rollout.manager.engine_fleet import EngineFleet
from slime.rollout.producer import RolloutProducer
from tests.helpers.compose import typed_config


class CursorSource:
    """The part of a data source a checkpoint touches."""

    def __init__(self) -> None:
        self.state = {"sample_offset": 0}

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_manager_checkpoint_restores_data_source_and_generators(tmp_path):
    cfg = typed_config([])
    setup = rollout_setup(cfg, plan_run(cfg, derive(cfg)))
    producer = RolloutProducer(setup, EngineFleet(dataclasses.replace(setup.fleet, specs=[]), []))
    producer.data_source = CursorSource()
    producer.data_source.state["sample_offset"] = 24
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    producer.save_checkpoint(0, str(tmp_path))
    expected = _draws()
    producer.data_source.state["sample_offset"] = 48  # the run went on, then died

    producer.load_checkpoint(0, str(tmp_path))
    assert _draws() == expected and producer.data_source.state == {"sample_offset": 24}
    assert sorted(p.name for p in (tmp_path / "rollout").iterdir()) == ["global_dataset_state_dict_0.pt", "rng_0.pt"]
