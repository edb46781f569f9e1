"""The algo options whose runs differ beyond their estimator record (tests/helpers/algo_options.py), the recipes of
the second wave (distillation, off-policy correction, routing replay) and ppo's critic end to end on the embedded
default; the first-step invariants; bad combinations. Every option's first step on a rank driven directly:
tests/algo/test_algo_first_step.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from slime.models.moe.routes import decode_routes
from tests.helpers.algo_options import ALGO_OPTIONS, END_TO_END, IN_PROCESS
from tests.helpers.metric_history import record
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_py_concurrently, selected_runs
from tests.helpers.validation import config_problems

# The pool's 9 runs, three at a time, last about as long as its full ppo run (531 s beside two others): each test
# waits for the whole pool, so pytest-timeout's 600 s default would cut it (and start the pool again for the
# next test); each run is bounded by its own 1800 s (tools/test.sh runs it beside two other pytest processes).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

POLICY_METRICS = {
    "train/pg_loss",
    "train/entropy_loss",
    "train/pg_clipfrac",
    "train/ppo_kl",
    "train/kl_loss",
    "train/grad_norm",
    "train/train_rollout_logprob_abs_diff",
    "rollout/raw_reward",
    "rollout/advantages",
}


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# grpo's run also carries TIS against the engine's log-probs (the knob leaves the first step on-policy).
KNOBS = {"grpo": ["algo.use_tis=true"]}
TIS_METRICS = {"train/tis", "train/tis_clipfrac", "train/tis_abs", "train/ois"}


# (overrides, the key the problem must name); the CLI's exit 2 on such problems: test_config.py
INVALID = [
    (["algo.use_kl_loss=true", "algo.kl_coef=0.1", "algo=ppo"], "algo.kl_coef"),
    (["algo=reinforce_plus_plus", "algo.normalize_advantages=false"], "algo.normalize_advantages"),
    (["algo.eps_clip_c=1.0"], "algo.eps_clip_c"),
    (["algo=ppo", "cluster.critic.num_gpus_per_node=0"], "cluster.critic.num_gpus_per_node"),
    (["algo=sft", "algo.use_tis=true"], "algo.use_tis"),
    (["algo.use_tis=true", "algo.use_rollout_logprobs=true"], "algo.use_tis"),
    (["algo.tis_level=sequence"], "algo.tis_level"),
    (["algo.use_tis=true", "algo.tis_level=seq"], "algo.tis_level"),
    (["algo=sft", "algo.use_opsm=true"], "algo.use_opsm"),
    (["algo.use_opsm=true", "algo.opsm_delta=-0.1"], "algo.opsm_delta"),
    (["algo.use_opd=true"], "algo.use_opd"),
    (["model@teacher=tiny_qwen3_teacher"], "teacher"),
    (["recipe=tiny_opd", "algo.opd_kl_coef=0"], "algo.opd_kl_coef"),
    (["recipe=tiny_opd", "algo=sft"], "algo.use_opd"),
    (["recipe=tiny_opd", "model@teacher=tiny_qwen3_moe"], "teacher.num_experts"),
    (["algo.routing_replay=always"], "algo.routing_replay"),
    (["recipe=tiny_routing_replay", "algo=sft"], "algo.routing_replay"),
    (
        ["recipe=tiny_routing_replay", "rollout=vllm", "rollout.weight_sync.mode=disk", "model.kv_channels=32"],
        "algo.routing_replay",
    ),
    (["algo.routing_replay=rollout"], "algo.routing_replay"),  # the embedded model is dense
    (
        ["recipe=tiny_routing_replay", "algo.routing_replay=train", "algo.use_rollout_logprobs=true"],
        "algo.routing_replay",
    ),
    (
        [
            "recipe=tiny_routing_replay",
            "parallelism=megatron",
            "parallelism.pp=2",
            "parallelism.recompute.granularity=full",
        ],
        "parallelism.recompute.granularity",
    ),
]
MISMATCH_METRICS = {
    "train/train_rollout_logprob_abs_diff",
    "train/mismatch_kl",
    "train/mismatch_k3_kl",
    "train/training_log_ppl",
    "train/rollout_log_ppl",
}


def sft_chat_rows() -> list[dict]:
    """Two-turn chats: the first answer is masked out (step_loss_mask 0), the last one is trained."""
    rows = []
    for d in range(10):
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"what comes after {d} ?"},
                    {"role": "assistant", "content": "no", "step_loss_mask": 0},
                    {"role": "user", "content": f"what comes after {(d + 1) % 10} ?"},
                    {"role": "assistant", "content": str((d + 2) % 10)},
                ]
            }
        )
    return rows


# The KL loss against the reference model: every run of an algo option carries it, so that its first step
# checks kl_loss == 0 (the reference is the starting policy); 0.001 changes no learning bound below.
KL_LOSS = ["algo.use_kl_loss=true", "algo.kl_loss_coef=0.001"]
# The algo options whose first-step check reads a longer run of this module instead of 2 rollouts of their own.
ALGO_RUN = {"ppo": "ppo_learns", "sft": "sft_chat"}


def run_overrides(data_file: Path) -> dict[str, list[str]]:
    """Every run of this module by key, the two long ones first (the full ppo run and the distillation run
    overlap the short ones; started last, either one alone would be the pool's tail)."""
    runs = {"ppo_learns": ["algo=ppo", *KL_LOSS], "opd": ["recipe=tiny_opd"]}
    short = [algo for algo in END_TO_END if algo not in ALGO_RUN]
    runs |= {f"algo={algo}": [f"algo={algo}", "train.num_rollout=2", *KL_LOSS, *KNOBS.get(algo, [])] for algo in short}
    runs["sft_chat"] = [
        "algo=sft",
        *KL_LOSS,
        "data=prompt_file",
        f"data.prompt_data={data_file}",
        "data.input_key=messages",
        "data.label_key=null",
        "rollout.batch_size=8",
        "train.global_batch_size=32",
        "train.num_rollout=10",
        "train.lr=3e-3",
    ]
    runs["ppo_critic"] = [
        "algo=ppo",
        "train.num_rollout=3",
        "algo.num_critic_only_steps=2",
        "cluster.critic.colocate_with_actor=true",
        "train.critic.lr=1e-2",
    ]
    runs["rollout_logprobs"] = ["algo.use_rollout_logprobs=true", "train.num_rollout=2"]
    runs["off_policy"] = ["recipe=tiny_off_policy", "train.num_rollout=2"]
    runs["routing_replay"] = ["recipe=tiny_routing_replay", "train.num_rollout=2", "debug.save_rollout_data=true"]
    return runs


def run_of(test: pytest.Item) -> str | None:
    """The key of the run `test` checks (None: it starts its own processes)."""
    if test.originalname == "test_the_algo_runs_and_its_first_step_is_on_policy":
        return algo_run(test.callspec.params["algo"])
    return RUN_OF_TEST.get(test.originalname)


def algo_run(algo: str) -> str:
    return ALGO_RUN.get(algo, f"algo={algo}")


RUN_OF_TEST = {
    "test_ppo_learns_and_its_value_loss_falls": "ppo_learns",
    "test_sft_trains_on_chat_jsonl_with_step_loss_mask": "sft_chat",
    "test_ppo_critic_roles_colocation_and_critic_only_steps": "ppo_critic",
    "test_rollout_logprobs_as_old_log_probs": "rollout_logprobs",
    "test_opsm_drops_drifted_samples_on_the_off_policy_step_only": "off_policy",
    "test_on_policy_distillation_halves_the_reverse_kl_to_the_teacher": "opd",
    "test_routing_replay_carries_the_engines_routes_to_the_trainer": "routing_replay",
}


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """{key: (run dir, finished process)} of the runs the selected tests check, three at a time: a short run
    is mostly start-up waits, which overlap. Returns once every run has ended, so no run's processes are left."""
    root = tmp_path_factory.mktemp("algos")
    data_file = root / "chats.jsonl"
    data_file.write_text("".join(json.dumps(r) + "\n" for r in sft_chat_rows()))
    wanted = selected_runs(request, run_of)
    jobs = {
        key: (root / re.sub(r"[^\w.-]+", "_", key), overrides)
        for key, overrides in run_overrides(data_file).items()
        if key in wanted
    }
    procs = main_py_concurrently(jobs, timeout=1800)
    return {key: (run_dir, procs[key]) for key, (run_dir, _) in jobs.items()}


def test_every_algo_option_is_checked_end_to_end_or_in_process():
    assert set(END_TO_END) <= set(ALGO_OPTIONS)
    assert set(ALGO_OPTIONS) - set(IN_PROCESS) <= set(END_TO_END)  # those a rank alone cannot check (a critic)


@pytest.mark.parametrize("algo", END_TO_END)
def test_the_algo_runs_and_its_first_step_is_on_policy(algo, runs):
    """Step 0: recomputed log-probs equal the old and reference ones, so ppo_kl and kl_loss are exactly 0."""
    run_dir, proc = runs[algo_run(algo)]
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = records(run_dir)
    steps = [r for r in logged if "train/step" in r]
    num_rollout = sum("rollout/raw_reward" in r for r in logged)
    assert num_rollout >= 2 and [r["train/step"] for r in steps] == list(range(2 * num_rollout))  # K = 2
    first = steps[0]
    assert first["train/kl_loss"] == 0.0
    keys = set().union(*logged)
    if algo == "sft":
        assert {"train/pg_loss", "train/kl_loss", "train/grad_norm"} <= keys
        assert steps[-1]["train/pg_loss"] < first["train/pg_loss"]  # the NLL goes down
    else:
        assert first["train/ppo_kl"] == 0.0 and first["train/pg_clipfrac"] == 0.0
        assert POLICY_METRICS <= keys
        assert max(r["train/ppo_kl"] != 0.0 for r in steps[1:])  # later steps are off-policy
    if algo == "ppo":
        assert {"train/value_loss", "train/value_clipfrac", "rollout/values", "rollout/returns"} <= keys
    if algo == "dapo":
        assert any(k.startswith("rollout/dynamic_filter/drop_zero_std") for k in keys)
    if "algo.use_tis=true" in KNOBS.get(algo, []):
        check_engine_log_probs(steps, TIS_METRICS)
        assert all(abs(r["train/tis"] - 1) < 1e-3 and r["train/tis_clipfrac"] == 0.0 for r in steps)
    assert_no_run_processes()


def check_engine_log_probs(steps: list[dict], expected: set[str]) -> None:
    assert expected <= set().union(*steps)
    # the engine and the trainer compute the same policy: mismatch only at float rounding
    assert all(r["train/train_rollout_logprob_abs_diff"] < 1e-4 for r in steps)


def test_ppo_learns_and_its_value_loss_falls(runs):
    """The full embedded run with algo=ppo. Rewards start near 0 (nothing for the critic to predict), so the
    value loss first rises with the rewards, then falls as the critic catches up with the policy."""
    run_dir, proc = runs["ppo_learns"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    record("ppo", run_dir, proc)
    logged = records(run_dir)
    # Spread over seeds 1-5 and 1234 (deterministic runs): last-3 mean reward 0.882-0.975; the value loss
    # (windows of 5 rollouts) peaks in window 1-5 of 12 at 2.1-5.3x the first window, and ends at
    # 0.19-0.26x its peak (without the KL loss; with it, seed 1234: 0.958, 2.6x in window 3, 0.24x). The bounds
    # below hold on every one of those seeds with a margin.
    rewards = [r["rollout/raw_reward"] for r in logged if "rollout/raw_reward" in r]
    assert sum(rewards[-3:]) / 3 >= 0.8
    losses = [r["train/value_loss"] for r in logged if "train/value_loss" in r]
    assert len(losses) == 120
    windows = [sum(losses[i : i + 10]) / 10 for i in range(0, 120, 10)]  # 5 rollouts each
    peak = max(range(len(windows)), key=windows.__getitem__)
    assert peak < 8 and windows[peak] > 1.5 * windows[0], windows  # rises with the rewards
    assert windows[-1] < 0.4 * windows[peak], windows  # then falls as the critic catches up


def test_sft_trains_on_chat_jsonl_with_step_loss_mask(runs):
    run_dir, proc = runs["sft_chat"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["train/pg_loss"] for r in records(run_dir) if "train/pg_loss" in r]
    assert losses[-1] < 0.5 * losses[0], losses
    lengths = [r["rollout/response_len/mean"] for r in records(run_dir) if "rollout/response_len/mean" in r]
    assert set(lengths) == {2.0}  # only "<digit> <|im_end|>" of the last turn is trained


@pytest.mark.parametrize("overrides,key", INVALID)
def test_invalid_algorithm_combinations_name_the_key(overrides, key):
    assert key in config_problems(overrides)


def test_ppo_critic_roles_colocation_and_critic_only_steps(runs):
    run_dir, proc = runs["ppo_critic"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in records(run_dir) if "train/step" in r]
    assert [r["train/step"] for r in steps] == list(range(6))
    assert all("train/pg_loss" not in r for r in steps[:4])  # rollouts 0 and 1: the critic alone trains
    assert all("train/pg_loss" in r for r in steps[4:])
    assert all(r["train/critic-lr-pg_0"] == 1e-2 and r["train/value_loss"] >= 0 for r in steps)
    critic_ckpt = run_dir / "checkpoints" / "critic"
    assert (critic_ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (critic_ckpt / "iter_0000002" / "model" / "model.safetensors").exists()


def test_rollout_logprobs_as_old_log_probs(runs):
    """algo.use_rollout_logprobs (TIS is checked in the grpo run of test_every_algo...)."""
    run_dir, proc = runs["rollout_logprobs"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_engine_log_probs([r for r in records(run_dir) if "train/step" in r], {"train/train_rollout_logprob_abs_diff"})


def test_opsm_drops_drifted_samples_on_the_off_policy_step_only(runs):
    """recipe=tiny_off_policy: two optimizer steps per rollout. The first is on-policy (ℓ = ℓ_old: OPSM drops
    nothing); after it the policy has moved, so the second drops some negative-advantage samples, never all of
    them (the threshold is 1e-4 nats of mean drift). The geometric-mean TIS weights stay 1 against the built-in
    engine (trainer and engine compute the same fp32 policy), and the mismatch metrics come with them."""
    run_dir, proc = runs["off_policy"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in records(run_dir) if "train/step" in r]
    assert [r["train/step"] for r in steps] == list(range(4))
    check_engine_log_probs(steps, TIS_METRICS | MISMATCH_METRICS | {"train/opsm_clipfrac"})
    first, second = steps[0::2], steps[1::2]
    assert all(r["train/opsm_clipfrac"] == 0.0 and r["train/ppo_kl"] == 0.0 for r in first)
    assert all(0.0 < r["train/opsm_clipfrac"] < 0.5 for r in second), [r["train/opsm_clipfrac"] for r in second]
    assert all(abs(r["train/tis"] - 1) < 1e-3 and r["train/mismatch_k3_kl"] < 1e-6 for r in steps)
    assert all(abs(r["train/training_log_ppl"] - r["train/rollout_log_ppl"]) < 1e-4 for r in steps)


def test_on_policy_distillation_halves_the_reverse_kl_to_the_teacher(runs):
    """recipe=tiny_opd: the student's mean reverse KL to the peaked teacher, on its own samples, falls by half
    over the run (measured: 2.74 nats at the first rollout; the last 5 of its 30 rollouts 0.34x of it, and
    0.44x already after 20)."""
    run_dir, proc = runs["opd"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    kls = [r["rollout/opd_reverse_kl"] for r in records(run_dir) if "rollout/opd_reverse_kl" in r]
    assert len(kls) == 30 and kls[0] > 2.0, kls
    assert sum(kls[-5:]) / 5 <= 0.5 * kls[0], kls
    steps = [r for r in records(run_dir) if "train/step" in r]
    assert all("train/opd_reverse_kl" in r for r in steps)


def test_routing_replay_carries_the_engines_routes_to_the_trainer(runs):
    """recipe=tiny_routing_replay: every sample the bf16 engine returned carries its routes, one row of 2 layers x
    top-2 expert ids per fed token (the real sglang-router strips the request for them, so the rollout sent it to
    the engine itself), the trainer replayed them on every step, and the sample log leaves them out."""
    run_dir, proc = runs["routing_replay"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    dumps = sorted((run_dir / "rollout_data").glob("*.jsonl"))
    samples = [json.loads(line) for path in dumps for line in path.read_text().splitlines()]
    assert len(dumps) == 2 and samples
    for s in samples:
        routes = decode_routes(s["routed_experts"], num_tokens=len(s["tokens"]), num_layers=2, topk=2)
        assert routes.min() >= 0 and routes.max() < 4 and (routes[..., 0] != routes[..., 1]).all()
    steps = [r for r in records(run_dir) if "train/step" in r]
    assert TIS_METRICS | MISMATCH_METRICS <= set().union(*steps)
    assert all(0 < r["train/train_rollout_logprob_abs_diff"] < 0.05 for r in steps)  # bf16 engine, fp32 trainer
    logged = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert logged and all("routed_experts" not in s for s in logged)
