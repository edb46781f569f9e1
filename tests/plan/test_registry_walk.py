"""slime/plan/validate.py: one walk over the config, the registry records' checks, every problem at once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slime.config import ConfigError
from slime.engine.hf.check import check as hf_check
from slime.plan.validate import collect_problems, validate
from slime.registry import ALL, ENGINES, Checks
from tests.helpers.compose import ROOT, typed_config
from tests.helpers.registry import registered

HEAVY = ("torch", "ray", "transformers", "sglang", "vllm", "megatron")


def keys_of(overrides: list[str]) -> dict[str, str]:
    return {p.key: str(p) for p in collect_problems(typed_config(overrides))}


def test_every_spec_and_its_checks_import_nothing_heavy():
    """Validation runs before anything starts: reading every part's spec module, its checks included, pulls in no
    torch, Ray or engine."""
    code = (
        "import sys\n"
        "from slime.registry import ALL\n"
        "checks = [c for r in ALL for n in r.names() for c in (r.checks(n).check, r.checks(n).check_unchosen) if c]\n"
        "assert all(callable(c) for c in checks)\n"
        f"print(len(checks), sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, loaded = proc.stdout.split(maxsplit=1)
    assert int(count) >= 9 and loaded.strip() == "[]"


def test_validating_the_default_run_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from tests.helpers.compose import typed_config\n"
        "from slime.plan.validate import validate\n"
        "validate(typed_config([]))\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_the_chosen_record_runs_its_check_and_the_others_their_unchosen_check(monkeypatch):
    hf_rule = ["rollout.deterministic=true", "rollout.hf.max_batch_size=4", "rollout.hf.num_threads=2"]
    assert "batches requests (batch-invariant)" in keys_of(hf_rule)["rollout.hf.max_batch_size"]
    # a part registered with its check: chosen, it runs
    registered(monkeypatch, ENGINES, "hf2", ENGINES.target("hf"), checks=Checks(check=hf_check))
    assert "rollout.hf.max_batch_size" in keys_of([*hf_rule, "rollout.engine=hf2"])
    # its unchosen check, of a record the config does not choose, runs too
    registered(monkeypatch, ENGINES, "hf2", ENGINES.target("hf"), checks=Checks(check_unchosen=hf_check))
    assert "rollout.hf.max_batch_size" not in keys_of([*hf_rule, "rollout.engine=hf2"])
    assert "rollout.hf.max_batch_size" in keys_of([*hf_rule, "rollout.engine=sglang"])


def test_a_name_registered_without_checks_has_none():
    assert ENGINES.checks("no_such_engine") == Checks()
    assert all(isinstance(r.checks(n), Checks) for r in ALL for n in r.names())


def test_every_problem_of_every_layer_is_reported_at_once():
    """A schema rule, a chosen record's check, an unchosen record's check and an owner's check, in one error."""
    overrides = [
        "train.lr=-1",  # slime/config/rules.py
        "parallelism.pp=2",  # the fsdp record's check
        "+parallelism.megatron.foo=1",  # the megatron record's unchosen check
        "data.prompt_data=/no/such/prompts.jsonl",  # slime/assets/check.py
    ]
    with pytest.raises(ConfigError) as info:
        validate(typed_config(overrides))
    keys = {p.key for p in info.value.problems}
    assert {"train.lr", "parallelism.pp", "parallelism.megatron", "data.prompt_data"} <= keys
    assert "the fsdp backend splits models by data and tensor parallelism only" in str(info.value)


def test_the_hf_engines_check_refuses_disaggregated_groups_which_sglang_serves():
    models = (
        "rollout.models=[{name: pd, server_groups: [{worker_type: prefill, num_gpus: 1},"
        " {worker_type: decode, num_gpus: 1}]}]"
    )
    overrides = [models, "cluster.colocate=false", "cluster.rollout.num_gpus=2", "cluster.num_gpus_per_node=3"]
    key = "rollout.models[0].server_groups[0].worker_type"
    found = keys_of(overrides)
    assert "PD disaggregation needs SGLang or vLLM servers, not rollout.engine=hf" in found[key]
    assert key not in keys_of([*overrides, "rollout.engine=sglang"])
