"""What a person sees: the run plots, the sweep plot (through the Hydra callback), the summary, plain progress."""

from __future__ import annotations

import io
import json

from omegaconf import OmegaConf
from rich.console import Console

from slime.tracking.plot import write_run_plots
from slime.tracking.progress import RunProgress
from slime.tracking.summary import render_summary
from slime.tracking.sweep import SweepSummary, sweep_runs


def write_metrics(run_dir, rewards, k=1):
    run_dir.mkdir(parents=True)
    lines = []
    for r, reward in enumerate(rewards):
        lines += [{"rollout/step": r, "train/step": r * k + j, "train/kl_loss": 0.01 * r} for j in range(k)]
        lines.append(
            {
                "rollout/step": r,
                "rollout/raw_reward": reward,
                "rollout/response_len/mean": 5.0,
                "perf/rollout_time": 2.0,
                "perf/train_time": 1.0,
                "perf/update_weights_time": 0.5,
                "perf/step_time": 4.0,
                "perf/train_tokens_per_s": 1000.0 * (r + 1),
                "perf/train_tflops": 100.0 * (r + 1),
                "perf/mfu": 0.1 * (r + 1),
                "perf/peak_gib/train": 10.0 + r,
                "perf/peak_gib/log_probs": 5.0,
                "perf/engine_gib/weight": 3.25,
                "perf/engine_gib/graph": 0.0625,
                "perf/engine_gib/kv_cache": 20.0 - r,
            }
        )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_run_plots_and_summary(tmp_path):
    run = tmp_path / "run"
    write_metrics(run, [0.1, 0.4, 0.8], k=2)
    with (run / "metrics.jsonl").open("a") as f:  # both eval naming styles: only the mean is shown
        f.write(
            json.dumps({"eval/step": 3, "eval/digit": 0.9, "eval/digit-pass@1": 0.9, "eval/digit/truncated_ratio": 0.0})
            + "\n"
        )
    written = write_run_plots(run / "metrics.jsonl", run)
    assert [p.name for p in written] == ["reward_curve.png", "training_curves.png"]
    assert all(p.stat().st_size > 10_000 for p in written)
    result = {
        "status": "completed",
        "phase": "done",
        "rollouts_completed": 3,
        "start_rollout": 0,
        "num_rollout": 3,
        "elapsed_s": 20.0,
        "run_dir": str(run),
        "memory_plan_gib": {"trainer": 15.0, "engine": 40.0},  # a CUDA run's dry-run estimate
        "outputs": {
            "plot:reward_curve": str(written[0]),
            "wandb": "/w/offline-run-x",
            "wandb_sync": "wandb sync /w/offline-run-x",
        },
    }
    text = render_summary(result, checkpoint_dir=str(tmp_path / "missing"))
    lines = text.splitlines()
    assert lines[1] == "Run completed: 3 rollout steps (0 -> 3 of 3) in 20.0s"
    assert "reward      first 0.1000 -> last 0.8000 (best 0.8000, 3 steps)" in lines
    assert "eval (last) eval/digit 0.9000" in lines
    assert "time        12.0s in 3 rollout steps (4.00s each)" in lines
    assert "  rollout             6.0s   50.0%" in lines and "  update_weights      1.5s   12.5%" in lines
    # the first step (compilation, warm-up) left out of the means: steps 2 and 3
    assert "training    2500 tokens/s, 250.00 TFLOP/s per GPU, MFU 25.0% (mean of 2 rollout steps)" in lines
    assert "peak GPU    log_probs 5.0 GiB, train 12.0 GiB" in lines
    assert "  trainer GPU: 12.0 GiB measured, 15.0 GiB planned (dry run), measured/planned 0.80" in lines
    assert "engines     graph 64.0 MiB, kv_cache 20.00 GiB, weight 3.25 GiB" in lines  # each part's largest report
    assert "  upload:   wandb sync /w/offline-run-x" in lines and not any(
        line.startswith("checkpoints") for line in lines
    )
    assert len(lines) <= 24  # one screen


def test_sweep_callback_writes_one_comparison_plot(tmp_path):
    sweep = tmp_path / "sweep"
    for job, rewards in (("0", [0.1, 0.2]), ("1", [0.3, 0.6]), ("10", [0.0, 0.1])):
        write_metrics(sweep / job, rewards)
        (sweep / job / ".hydra").mkdir()
        (sweep / job / ".hydra" / "overrides.yaml").write_text(f"- algo.eps_clip=0.{job}\n- hydra.verbose=false\n")
    assert list(sweep_runs(sweep)) == ["0: algo.eps_clip=0.0", "1: algo.eps_clip=0.1", "10: algo.eps_clip=0.10"]
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert (sweep / "sweep_rewards.png").stat().st_size > 10_000


def test_plain_progress_lines_when_not_a_terminal(monkeypatch):
    out = io.StringIO()
    clock = iter([0.0, 12.5, 13.0, 13.5])
    monkeypatch.setattr("slime.tracking.progress.time.monotonic", lambda: next(clock))
    progress = RunProgress(total=5, enabled=True, console=Console(file=out, width=120), slow_phase_s=10)
    progress.begin(0)
    progress.on_phase("rollout", 0)  # t=0
    progress.on_phase("train", 0)  # t=12.5: the rollout phase was slow, so it gets a line
    progress.on_phase("weight_sync", 0)  # t=13: training took 0.5 s, no line
    progress.step_done(0, {"rollout/raw_reward": 0.25, "perf/step_time": 13.4})
    progress.close()
    assert out.getvalue().splitlines() == ["rollout 0 generating: 12.5s", "rollout    0/5  reward 0.250  13.40s/step"]


def test_live_progress_shows_the_phase_under_way():
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    progress = RunProgress(total=5, enabled=True, steps_per_rollout=2, console=console)
    progress.begin(2)
    progress.on_phase("weight_sync", -1)
    assert progress.progress.tasks[0].description == "initial weight push..."
    progress.on_phase("train", 2)
    assert progress.progress.tasks[0].description == "rollout 2: training (2 optimizer steps)..."
    progress.step_done(2, {"rollout/raw_reward": 0.5})
    assert progress.progress.tasks[0].completed == 3
    progress.close()


def test_summary_of_a_run_killed_mid_line(tmp_path):
    run = tmp_path / "run"
    write_metrics(run, [0.2, 0.3])
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"rollout/step": 2, "rollout/raw_re')  # a forced exit cut the last write
    result = {"status": "interrupted", "phase": "train", "rollouts_completed": 2, "start_rollout": 0}
    text = render_summary({**result, "num_rollout": 5, "elapsed_s": 9.0, "run_dir": str(run)})
    assert "Run interrupted in phase train: 2 rollout steps (0 -> 2 of 5) in 9.0s" in text
    assert "first 0.2000 -> last 0.3000" in text
