"""slime.train.base.call_backend: the runtime's ranks run interface functions, given as references, as the
backend's own overrides; anything that is not a function of the backend's classes is refused."""

from __future__ import annotations

import pytest

from slime.train.base import TrainBackend, call_backend
from slime.train.layout import RankLayout
from tests.helpers.train_ranks import RecordingBackend


class LoudBackend(RecordingBackend):
    def train(self, *, update: bool = True) -> dict:
        return {"steps": [{"update": update}], "perf": {}}


def backend(cls=LoudBackend):
    return cls(None, rank=0, layout=RankLayout(dp=1), master_addr="", master_port=0)


def test_an_interface_reference_runs_the_most_derived_override():
    assert call_backend(backend(), TrainBackend.train, update=False) == {"steps": [{"update": False}], "perf": {}}
    assert call_backend(backend(RecordingBackend), TrainBackend.train) == {"steps": [], "perf": {}}
    assert call_backend(backend(), TrainBackend.init) == 0


def test_a_subclass_method_and_a_base_class_method_both_dispatch():
    assert call_backend(backend(), RecordingBackend.received)["rank"] == 0
    assert call_backend(backend(), LoudBackend.train)["steps"] == [{"update": True}]


def unrelated(self):
    return "ran"


class Other:
    def train(self):
        return "other"


@pytest.mark.parametrize("method", [unrelated, Other.train, "train", len])
def test_anything_but_a_function_of_the_backends_classes_is_refused(method):
    with pytest.raises(TypeError, match="is not a method of LoudBackend"):
        call_backend(backend(), method)
