"""Validation of the SGLang rollout settings: each problem exits 2 before anything starts, naming the key."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.compose import ROOT, typed_config
from tests.helpers.validation import config_problems

TWO_MODELS = (
    "rollout.models=[{name: actor, server_groups: [{num_gpus: 2}]},"
    " {name: ref, update_weights: false, server_groups: [{num_gpus: 1}]}]"
)


def test_server_groups_must_add_up_to_the_rollout_gpus():
    found = config_problems([TWO_MODELS, "cluster.rollout.num_gpus=2"])
    assert "add up to 3, but the rollout has 2 GPU(s)" in found["rollout.models"]
    assert "cluster.rollout.num_gpus=3" in found["rollout.models"]
    cfg = typed_config([TWO_MODELS, "cluster.rollout.num_gpus=3"])
    from slime.engine.groups import engine_specs, model_specs
    from slime.plan.validate import validate

    validate(cfg)
    assert [(s.model, s.num_gpus) for s in engine_specs(cfg, 3)] == [("actor", 1), ("actor", 1), ("ref", 1)]
    assert [(m.name, m.update_weights) for m in model_specs(cfg)] == [("actor", True), ("ref", False)]


def test_group_sizes_worker_types_and_pd_pairs():
    found = config_problems(
        [
            "rollout=sglang",
            "cluster.rollout.num_gpus=3",
            "rollout.models=[{name: pd, server_groups: [{worker_type: prefill, num_gpus: 3, num_gpus_per_engine: 2}]}]",
        ]
    )
    assert (
        "positive multiple of the group's GPUs per engine (2)" in found["rollout.models[0].server_groups[0].num_gpus"]
    )
    assert "needs both prefill and decode" in found["rollout.models[0].server_groups"]
    found = config_problems(["rollout.models=[{name: a, server_groups: [{worker_type: decode, num_gpus: 1}]}]"])
    assert (
        "needs SGLang or vLLM servers, not rollout.engine=hf" in found["rollout.models[0].server_groups[0].worker_type"]
    )
    found = config_problems(["rollout.external_engines=[127.0.0.1:3000]"])
    assert "http://host:port" in found["rollout.external_engines[0]"]


def test_framework_owned_server_args_are_rejected():
    found = config_problems(
        [
            "rollout=sglang",
            "+rollout.sglang.tp_size=2",
            "cluster.rollout.num_gpus=1",
            "rollout.models=[{name: a, server_groups: [{num_gpus: 1, overrides: {port: 30000, mem_fraction_static: 0.7}}]}]",
        ]
    )
    assert "set cluster.rollout.num_gpus_per_engine instead" in found["rollout.sglang.tp_size"]
    assert "a port the framework reserves" in found["rollout.models[0].server_groups[0].overrides.port"]
    assert "rollout.models[0].server_groups[0].overrides.mem_fraction_static" not in found


def test_server_args_the_command_line_cannot_carry_are_rejected():
    found = config_problems(
        [
            "rollout=sglang",
            "+rollout.sglang.watermark_key=k",
            "+rollout.sglang.enable_multimodal=false",
            "+rollout.sglang.attention_backend=flash",
            "cluster.rollout.num_gpus=1",
            "rollout.models=[{name: a, server_groups: [{num_gpus: 1, overrides: {sidecar_args: [--x, '1'], numa_node: 0}}]}]",
        ]
    )
    assert (
        "SGLang 0.5.23 has no command-line flag for ServerArgs.watermark_key" in found["rollout.sglang.watermark_key"]
    )
    assert "false cannot be expressed on its command line" in found["rollout.sglang.enable_multimodal"]
    assert "set it to true" in found["rollout.sglang.enable_multimodal"]
    assert "not one of SGLang's choices for --attention-backend" in found["rollout.sglang.attention_backend"]
    overrides = "rollout.models[0].server_groups[0].overrides"
    assert f"{overrides}.sidecar_args" not in found  # a list goes as one JSON word
    assert "takes a list (--numa-node V1 V2 ...), got int" in found[f"{overrides}.numa_node"]


def test_an_installed_sglang_of_another_version_is_rejected(tmp_path, monkeypatch):
    """The command line is rendered from 0.5.23's recorded parser: another installed version must be recorded."""
    dist = tmp_path / "sglang-9.9.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = config_problems(["rollout=sglang", "cluster.rollout.num_gpus=1"])
    assert (
        "the installed sglang is 9.9.0, but server command lines are rendered from sglang 0.5.23"
        in found["rollout.sglang"]
    )
    assert "python tools/gen_sglang_server_args.py" in found["rollout.sglang"]


def test_main_exits_2_naming_each_problem():
    proc = subprocess.run(
        [
            sys.executable,
            "main.py",
            "rollout=sglang",
            "+rollout.sglang.random_seed=3",
            "cluster.rollout.num_gpus=3",
            "cluster.rollout.num_gpus_per_engine=2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "rollout.sglang.random_seed" in proc.stderr and "set seed instead" in proc.stderr
    assert "cluster.rollout.num_gpus=3: not a multiple of cluster.rollout.num_gpus_per_engine=2" in proc.stderr


def test_tensor_handle_ranks_follow_the_engine_bundles():
    """Colocated: engine bundles start at bundle 0, so TP rank i of an engine sits with the training rank of
    its bundle; frozen models get no syncs, bundles past the trainer's have no colocated rank (-1)."""
    from slime.config.schema import RolloutConfig, RouterConfig
    from slime.engine.fleet_setup import FleetSetup
    from slime.engine.groups import EngineSpec, ModelSpec
    from slime.rollout.manager.engine_fleet import EngineFleet, EngineSlot

    def spec(model, gpus):
        return EngineSpec(model=model, worker_type="regular", num_gpus=gpus, overrides={}, key="k")

    specs = [spec("actor", 2), spec("ref", 1), spec("actor", 2)]
    models = [
        ModelSpec(name="actor", model_path="/m", update_weights=True, router=RouterConfig()),
        ModelSpec(name="ref", model_path="/m", update_weights=False, router=RouterConfig()),
    ]
    setup = FleetSetup(
        rollout=RolloutConfig(batch_size=1),
        models=models,
        specs=specs,
        host="h",
        device="cuda",
        colocate=True,
        seed=0,
        run_dir="/tmp",
        trainer_gpus=4,
    )
    fleet = EngineFleet(setup, placements=[None] * 3)
    fleet.slots = [EngineSlot(rank=i, spec=s, actor=None, url=f"http://h:{i}") for i, s in enumerate(specs)]
    assert fleet.sync_urls() == ["http://h:0", "http://h:2"]
    assert fleet.tensor_handle_ranks() == ((0, 1), (3, -1))
    fleet.slots[2].dead = True
    assert fleet.tensor_handle_ranks() == ((0, 1),) and fleet.sync_urls() == ["http://h:0"]
