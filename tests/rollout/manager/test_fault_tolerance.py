"""Fault tolerance against SGLang's rules (docs/engines.md#fault-tolerance): the probe timeout outlasts SGLang's own
/health timeout (validation); the fleet probes only while the engines serve, so a weight push longer than the probe
timeout restarts no engine; a restarted engine is released before the push resumes its weights (colocation)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from slime.config import ConfigError
from slime.plan.validate import validate
from tests.helpers.compose import typed_config
from tests.helpers.fleet import running_fleet, wait_until
from tests.helpers.runs import assert_stopped_in_validation, run_main
from tests.helpers.vllm_real import CPU_VLLM

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
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "2.5")  # SGLang's int() would fail at import
    assert "'2.5' is no integer" in problems(["rollout=sglang", *FT])[TIMEOUT_KEY]


def test_vllm_has_no_floor_and_every_engine_needs_positive_values(monkeypatch):
    monkeypatch.delenv("SGLANG_HEALTH_CHECK_TIMEOUT", raising=False)
    validate(typed_config([*CPU_VLLM, *FT, f"{TIMEOUT_KEY}=2"]))  # vLLM's /health generates nothing
    found = problems([*CPU_VLLM, *FT, "rollout.fault_tolerance.health_check_interval_s=0"])
    assert "must be > 0" in found["rollout.fault_tolerance.health_check_interval_s"]
    validate(typed_config(["rollout=sglang", f"{TIMEOUT_KEY}=1"]))  # fault tolerance off: nothing to check


def test_the_cli_stops_a_short_probe_timeout_before_ray(tmp_path):
    proc, imported = run_main("rollout=sglang", *FT, f"{TIMEOUT_KEY}=10", f"hydra.run.dir={tmp_path}")
    assert_stopped_in_validation(proc, imported)
    assert TIMEOUT_KEY in proc.stderr and "SGLANG_HEALTH_CHECK_TIMEOUT" in proc.stderr


# ---------------------------------------------------------------------------------------------- the fleet
# Real engines (the hf engine, whose /health follows SGLang's: a generation that waits while generation is paused
# and answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT) behind the real router, in a real Ray session. The probe
# timeout is shorter than any validated one, so that a probe of a paused engine fails within a second.
ENGINE_ENV = {"SGLANG_HEALTH_CHECK_TIMEOUT": "3"}
PROBE_TIMEOUT_S = 1.0
FAST_PROBES = [*FT, "rollout.fault_tolerance.health_check_interval_s=0.1", f"{TIMEOUT_KEY}={PROBE_TIMEOUT_S}"]


def fleet_overrides(model_dir: str, *more: str) -> list[str]:
    return [f"model.hf_checkpoint={model_dir}", "rollout.hf.num_threads=1", *FAST_PROBES, *more]


def server_pid(fleet, rank: int) -> int:
    return fleet.slots[rank].info["pid"]


def released_tags(fleet) -> list[list[str]]:
    """Per synced engine, the memory tags its server reports released."""
    return [fleet.client(url).server_info()["internal_states"][0]["released_tags"] for url in fleet.sync_urls()]


def registered(fleet) -> list[str]:
    return sorted(w["url"] for w in fleet.routers[fleet.policy.name].list_workers())


@pytest.mark.slow
def test_a_push_longer_than_the_probe_timeout_restarts_no_engine(tiny_model_dir, tmp_path):
    """The driver's push (begin_push ... end_push) pauses both engines for three probe timeouts: no engine is
    found dead. Then the probes are back: a pause the fleet was not told of fails its engine's probes (what
    every push did before), and a killed engine is found; both are restarted."""
    overrides = fleet_overrides(tiny_model_dir, "cluster.rollout.num_gpus=2")
    with running_fleet(overrides, tmp_path, engine_env=ENGINE_ENV) as fleet:
        urls = registered(fleet)
        assert len(urls) == 2
        fleet.begin_push()
        for client in fleet.clients():  # what the weight sync does first (slime.sync.base)
            client.pause_generation()
        push_ends = time.monotonic() + 3 * PROBE_TIMEOUT_S
        while time.monotonic() < push_ends:
            assert fleet.dead_ranks() == []
            time.sleep(0.05)
        for client in fleet.clients():
            client.continue_generation()
        fleet.end_push()
        assert fleet.dead_ranks() == [] and registered(fleet) == urls

        fleet.client(fleet.slots[0].url).pause_generation()  # paused behind the fleet's back
        wait_until(lambda: fleet.dead_ranks() == [0], what="engine 0's probe failing")
        os.kill(server_pid(fleet, 1), signal.SIGKILL)
        wait_until(lambda: fleet.dead_ranks() == [0, 1], what="engine 1's probe failing")
        # marked dead first, then taken out of the router (the router's DELETE is answered before it takes effect)
        wait_until(lambda: registered(fleet) == [], what="both engines out of the router")
        assert fleet.recover() == [0, 1]
        fleet.register_restarted([0, 1])
        assert len(registered(fleet)) == 2 and all(slot.restarts == 1 for slot in fleet.slots)


@pytest.mark.slow
def test_a_restarted_colocated_engine_is_released_before_its_weights_are_resumed(tiny_model_dir, tmp_path):
    """Colocated: every engine has released its memory (training); one dies; the push restarts it, and it comes
    up released, so resuming "weights" and then the KV cache on every engine is what SGLang accepts (the hf
    engine answers 400 where SGLang's scheduler dies: a resume of a tag that is not released)."""
    overrides = fleet_overrides(tiny_model_dir, "cluster.colocate=true", "cluster.actor.num_gpus_per_node=2")
    with running_fleet(overrides, tmp_path, engine_env=ENGINE_ENV) as fleet:
        assert len(fleet.slots) == 2
        fleet.release_memory()  # what the manager does once the engines are up (and before each training step)
        assert released_tags(fleet) == [["cuda_graph", "kv_cache", "weights"]] * 2
        os.kill(server_pid(fleet, 1), signal.SIGKILL)
        fleet.begin_push()
        wait_until(lambda: fleet.find_dead() == [1], what="engine 1's server found gone")  # no probe needed
        assert fleet.recover() == [1]
        assert released_tags(fleet) == [["cuda_graph", "kv_cache", "weights"]] * 2  # the new engine released at once
        fleet.resume_memory(["weights"])
        assert released_tags(fleet) == [["cuda_graph", "kv_cache"]] * 2
        fleet.resume_memory(["kv_cache", "cuda_graph"])
        fleet.register_restarted([1])
        fleet.end_push()
        assert released_tags(fleet) == [[], []] and len(registered(fleet)) == 2
        time.sleep(10 * 0.1)  # ten probe rounds on the served engines: all healthy
        assert fleet.dead_ranks() == []
