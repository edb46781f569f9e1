"""Exceptions with their own fields reach the driver whole: Ray pickles an actor's exception, and one whose
`__init__` takes more than its message came back as Ray's UnserializableException (slime.config.problems.PicklableFields)."""

from __future__ import annotations

import pickle

import pytest

from slime.config.hooks import HookError
from slime.config.problems import ConfigError, Problem
from slime.engine.http_client import EngineHTTPError
from slime.rollout.data_source import PromptsTooLong
from slime.rollout.prompt_file import DataFileError

ERRORS = {
    "engine_http": EngineHTTPError("POST", "http://127.0.0.1:1/pause_generation", None, "ConnectionRefusedError(111)"),
    "hook": HookError("rollout.function", "my.mod:fn", "cannot import", missing="math_verify"),
    "data_file": DataFileError("prompts.jsonl:3", "no field 'prompt'", fix="add it"),
    "too_long": PromptsTooLong("prompts.jsonl", 8, [9, 12, 30]),
    "config": ConfigError([Problem("train.lr", -1, "must be > 0", "set train.lr=1e-6")]),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_an_error_with_its_own_fields_survives_pickling(name):
    error = ERRORS[name]
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert vars(copy) == vars(error)


def test_the_fields_are_the_ones_given():
    copy = pickle.loads(pickle.dumps(ERRORS["engine_http"]))
    assert (copy.method, copy.status, copy.body) == ("POST", None, "ConnectionRefusedError(111)")
    assert str(copy) == "POST http://127.0.0.1:1/pause_generation: connection failed: ConnectionRefusedError(111)"
    too_long = pickle.loads(pickle.dumps(ERRORS["too_long"]))
    assert (too_long.count, too_long.shortest, too_long.longest) == (3, 9, 30)
    assert pickle.loads(pickle.dumps(ERRORS["config"])).problems[0].key == "train.lr"
