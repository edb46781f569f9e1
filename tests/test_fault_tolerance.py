"""Fault tolerance against SGLang's rules (issue 22): the probe timeout outlasts SGLang's own /health timeout
(validation); the fleet probes only while the engines serve, so a weight push longer than the probe timeout
restarts no engine; a restarted engine is released before the push resumes its weights (colocation)."""

from __future__ import annotations

import pytest

from slime.config import ConfigError, validate
from tests.conftest import typed_config
from tests.test_config_presets import assert_stopped_in_validation, run_main

FT = ["rollout.fault_tolerance.enabled=true"]
TIMEOUT_KEY = "rollout.fault_tolerance.health_check_timeout_s"


def problems(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate(typed_config(overrides))
    return {p.key: str(p) for p in info.value.problems}


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("engine", ["sglang", "hf"])
def test_a_probe_timeout_under_sglangs_own_health_timeout_is_refused(engine, monkeypatch):
    monkeypatch.delenv("SGLANG_HEALTH_CHECK_TIMEOUT", raising=False)
    found = problems([f"rollout={engine}", *FT, f"{TIMEOUT_KEY}=10"])
    assert list(found) == [TIMEOUT_KEY]
    assert "must be >= 25 s" in found[TIMEOUT_KEY] and "SGLANG_HEALTH_CHECK_TIMEOUT=20 s" in found[TIMEOUT_KEY]
    validate(typed_config([f"rollout={engine}", *FT]))  # the defaults are above it
    validate(typed_config([f"rollout={engine}", *FT, f"{TIMEOUT_KEY}=25"]))


def test_the_floor_follows_the_engines_environment(monkeypatch):
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "3")
    validate(typed_config(["rollout=sglang", *FT, f"{TIMEOUT_KEY}=8"]))
    assert "must be >= 8 s" in problems(["rollout=sglang", *FT, f"{TIMEOUT_KEY}=7.5"])[TIMEOUT_KEY]


def test_vllm_has_no_floor_and_every_engine_needs_positive_values(monkeypatch):
    monkeypatch.delenv("SGLANG_HEALTH_CHECK_TIMEOUT", raising=False)
    validate(typed_config(["rollout=vllm", *FT, f"{TIMEOUT_KEY}=2"]))  # vLLM's /health generates nothing
    found = problems(["rollout=vllm", *FT, "rollout.fault_tolerance.health_check_interval_s=0"])
    assert "must be > 0" in found["rollout.fault_tolerance.health_check_interval_s"]
    validate(typed_config(["rollout=sglang", f"{TIMEOUT_KEY}=1"]))  # fault tolerance off: nothing to check


def test_the_cli_stops_a_short_probe_timeout_before_ray(tmp_path):
    proc, imported = run_main("rollout=sglang", *FT, f"{TIMEOUT_KEY}=10", f"hydra.run.dir={tmp_path}")
    assert_stopped_in_validation(proc, imported)
    assert TIMEOUT_KEY in proc.stderr and "SGLANG_HEALTH_CHECK_TIMEOUT" in proc.stderr
