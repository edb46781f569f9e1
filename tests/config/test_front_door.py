"""main.py's front door (slime/driver/front_door.py): a mistyped key or option is answered with the nearest
names before Hydra's own advice, and a configuration error or a dry run leaves no directory behind.

In-process cases call `check_command_line` as main.py does; the CLI cases run main.py itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime.config.cli_overrides import LISTED_OPTIONS
from slime.driver.front_door import check_command_line
from tests.helpers.compose import CONF, ROOT


def front_door(*argv: str) -> None:
    check_command_line(list(argv), config_dir=CONF, config_name="config", job_name="main")


def refused(capsys, *argv: str) -> list[str]:
    """The stderr lines of a command line the front door refuses (exit 2)."""
    with pytest.raises(SystemExit) as info:
        front_door(*argv)
    assert info.value.code == 2
    return capsys.readouterr().err.splitlines()


def main_py(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """main.py with the checkout's outputs/ moved to `tmp_path/outputs` (paths.root_dir follows SLIME_ROOT)."""
    return subprocess.run(
        [sys.executable, "main.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SLIME_ROOT": str(tmp_path)},
    )


@pytest.mark.parametrize(
    "argv,first_line",
    [
        (
            ["algo.kl_coeff=0.1"],
            "algo.kl_coeff=0.1: no such key (did you mean algo.kl_coef, algo.opd_kl_coef, algo.kl_loss_coef?). "
            "Fix: algo.kl_coef=0.1",
        ),
        (
            ["+algo.kl_coeff=0.1"],
            "+algo.kl_coeff=0.1: no such key (did you mean algo.kl_coef, algo.opd_kl_coef, algo.kl_loss_coef?). "
            "Fix: algo.kl_coef=0.1",
        ),
        # the right name in another node
        (["train.kl_coef=0.1"], "train.kl_coef=0.1: no such key (did you mean algo.kl_coef?). Fix: algo.kl_coef=0.1"),
        (
            ["~algo.kl_cof"],
            "~algo.kl_cof: no such key (did you mean algo.kl_coef, algo.opd_kl_coef, algo.kl_loss_coef?). "
            "Fix: ~algo.kl_coef",
        ),
        (["~rollout.sglang.nothing_like_it"], "~rollout.sglang.nothing_like_it: nothing to delete. Fix: remove it"),
        (["hydra.run.dri=/x"], "hydra.run.dri=/x: no such key (did you mean hydra.run.dir?). Fix: hydra.run.dir=/x"),
        (
            ["+algo.kl_coef=0.1"],
            "+algo.kl_coef=0.1: algo.kl_coef is already set; a leading + only adds a key that is not. "
            "Fix: algo.kl_coef=0.1",
        ),
        (  # a free-form dict takes new keys with +, which Hydra's advice rightly says
            ["rollout.sglang.mem_fraction_static=0.7"],
            "rollout.sglang.mem_fraction_static=0.7: rollout.sglang holds free-form keys and has no "
            "mem_fraction_static yet. Fix: +rollout.sglang.mem_fraction_static=0.7",
        ),
        (
            ["modle@teacher=qwen3_4b"],
            "modle@teacher=qwen3_4b: no such group (did you mean model?). Fix: model@teacher=qwen3_4b",
        ),
    ],
)
def test_a_mistyped_key_names_the_nearest_keys(capsys, argv, first_line):
    lines = refused(capsys, *argv)
    assert lines[0] == f"Configuration error: {first_line}"
    assert len(lines) == 1


@pytest.mark.parametrize(
    "argv,line",
    [
        (
            ["model=qwen3_5b"],
            "model=qwen3_5b: no such option of group model (did you mean qwen3_8b, qwen3_4b, qwen3_1_7b?). "
            "Fix: model=qwen3_8b (the options: deepseek_v3, glm4_5, glm4_5_air,",
        ),
        (
            ["algo=grpp"],
            "algo=grpp: no such option of group algo (did you mean grpo?). "
            "Fix: algo=grpo (the options: cispo, dapo, dr_grpo, grpo, grpo_clip_higher, grpo_entropy, gspo,",
        ),
        (
            ["recipe=smollm2_arithmetc"],
            "recipe=smollm2_arithmetc: no such option of group recipe (did you mean smollm2_arithmetic, smollm2_agent?). "
            "Fix: recipe=smollm2_arithmetic",
        ),
        (
            ["recipe=deepseek_v3_grpo"],  # an option in a subfolder
            "recipe=deepseek_v3_grpo: no such option of group recipe (did you mean gpu/deepseek_v3_grpo?). "
            "Fix: recipe=gpu/deepseek_v3_grpo",
        ),
        (
            ["model@teacher=qwen3_5b"],
            "model@teacher=qwen3_5b: no such option of group model (did you mean qwen3_8b, qwen3_4b, qwen3_1_7b?). "
            "Fix: model@teacher=qwen3_8b",
        ),
        (  # each choice of a sweep
            ["--multirun", "algo=grpo,dapx"],
            "algo=dapx: no such option of group algo (did you mean dapo?). Fix: algo=dapo",
        ),
    ],
)
def test_an_unknown_option_names_the_nearest_options(capsys, argv, line):
    (printed,) = refused(capsys, *argv)
    assert printed.startswith(f"Configuration error: {line}"), printed


def test_the_option_list_is_brief(capsys):
    (line,) = refused(capsys, "recipe=nothing_like_it")  # the first LISTED_OPTIONS recipes, then how many more
    recipes = len(list((ROOT / "recipes").rglob("*.yaml")))
    assert recipes > LISTED_OPTIONS + 20
    assert line.endswith(f", ... ({recipes - LISTED_OPTIONS} more)>"), line
    assert "no such option of group recipe. Fix: recipe=<one of digit_long_tail, embedded_dp2, " in line


@pytest.mark.parametrize(
    "argv",
    [
        ["+rollout.sglang.mem_fraction_static=0.7", "+parallelism.megatron.recompute_granularity=full"],
        ["model.rope_scaling={type:linear,factor:2.0}", "+rollout.router.extra_args.cache_threshold=0.3"],
        ["+data.generator.num_prompt=5"],  # a hook's kwargs are free-form here; validation names the typo
        ["~data.generator.path", "data.prompt_data=/x.jsonl"],
        ["model@teacher=tiny_qwen3_teacher", "teacher.hf_checkpoint=/x", "algo.use_opd=true"],
        ["recipe=gpu/deepseek_v3_grpo", "hydra/launcher=ray_jobs", "hydra.launcher.address=auto"],
        ["recipe=tiny_optuna", "hydra.sweeper.n_trials=2"],
        ["++algo.kl_coef=0.1", "+eval.datasets.held_out={prompt_data:/x.jsonl}"],
    ],
)
def test_accepted_forms_pass(argv):
    front_door("--cfg", "job", *argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--multirun", "algo=grpo,dapo", "train.lr=1e-6,1e-5"],
        ["--multirun", "algo=glob(*)"],
        ["hydra.mode=MULTIRUN", "algo=grpo,dapo"],  # a sweep without the flag
        ["--multirun", "recipe=tiny_optuna", "train.lr=tag(log,interval(1e-6,1e-4))"],
        ["--help"],
        ["--cfg", "hydra", "hydra.job.chdir=false"],
    ],
)
def test_sweeps_and_printing_modes_pass_without_validating(argv):
    front_door(*argv)


def test_cfg_job_with_a_typo_is_refused(capsys):
    assert refused(capsys, "--cfg", "job", "algo.kl_coeff=1")[0].startswith("Configuration error: algo.kl_coeff=1")


def test_a_secret_value_is_never_echoed(capsys):
    (line,) = refused(capsys, "+logger.wandb.api_key=hunter2-secret")
    assert line.startswith("Configuration error: +logger.wandb.api_key=<redacted>: no such key. Fix: remove it;")
    assert "hunter2" not in line


def test_a_typo_beside_other_problems_lists_them_all(capsys):
    lines = refused(capsys, "+train.lr_schedulr=cosine", "checkpoint.save_interval=0")
    assert lines[0].startswith("Configuration error: +train.lr_schedulr=cosine: no such key. Fix: remove it;")
    assert lines[1:] == [
        "Configuration error: invalid configuration (1 problem):",
        "  - checkpoint.save_interval=0: must be > 0. Fix: set checkpoint.save_interval to a positive number",
    ]


@pytest.mark.parametrize("plus", ["", "+"])
def test_cli_typo_exits_2_first_naming_the_key_and_writes_nothing(tmp_path, plus):
    """As a user types it: the default run directory (tmp_path/outputs) and an explicit one stay absent."""
    proc = main_py(tmp_path, f"{plus}algo.kl_coeff=0.1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[0].startswith(f"Configuration error: {plus}algo.kl_coeff=0.1: no such key")
    assert "did you mean algo.kl_coef" in proc.stderr.splitlines()[0]
    assert "To append to your config" not in proc.stderr and "Traceback" not in proc.stderr
    run_dir = tmp_path / "explicit" / "run"
    assert main_py(tmp_path, f"{plus}algo.kl_coeff=0.1", f"hydra.run.dir={run_dir}").returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cli_unknown_model_exits_2_naming_the_nearest(tmp_path):
    proc = main_py(tmp_path, "model=qwen3_5b")
    assert proc.returncode == 2, proc.stderr
    assert "no such option of group model (did you mean qwen3_8b, qwen3_4b, qwen3_1_7b?)" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv,code",
    [
        (["debug=dry_run"], 0),
        (["debug=dry_run", "train.global_batch_size=100"], 2),  # the dry run's own refusal
        (["train.global_batch_size=100"], 2),  # a validation error of a launch
        (["rollout.batch_size=abc"], 2),  # a type error while composing
    ],
)
def test_dry_runs_and_config_errors_leave_no_run_directory(tmp_path, argv, code):
    run_dir = tmp_path / "explicit" / "run"
    for where in ([], [f"hydra.run.dir={run_dir}"]):
        proc = main_py(tmp_path, *argv, *where)
        assert proc.returncode == code, proc.stderr
        assert "Traceback" not in proc.stderr
        assert list(tmp_path.iterdir()) == [], sorted(str(p) for p in tmp_path.rglob("*"))
    if code == 0:
        assert proc.stdout.rstrip().endswith("Dry run: configuration valid; nothing was started.")


def test_help_points_at_the_dry_run():
    proc = subprocess.run([sys.executable, "main.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "  python main.py model=qwen3_4b algo=grpo debug=dry_run   plan the run (placement, batch" in proc.stdout
    assert "starts nothing and writes nothing" in proc.stdout


def test_an_unknown_option_and_a_mistyped_key_are_named_together(capsys):
    lines = refused(capsys, "model=qwen3_5b", "algo.kl_coeff=1")
    assert [line.split(":")[1] for line in lines] == [" model=qwen3_5b", " algo.kl_coeff=1"]
