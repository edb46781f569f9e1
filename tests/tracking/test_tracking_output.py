"""What a person sees: the run plots, the sweep plot (through the Hydra callback), the summary, plain progress."""

from __future__ import annotations

import io
import json
import logging

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
        # a CUDA run's plan: the dry run's for full micro-batches, and for the fullest one the run trained
        "memory_plan_gib": {
            "trainer": 15.0,
            "engine": 40.0,
            "micro_batch_tokens": 71680,
            "trainer_sized": 12.5,
            "largest_micro_batch_tokens": 11200,
        },
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
    assert (
        "  trainer GPU: 12.0 GiB measured, 15.0 GiB planned (dry run, micro-batches of 71680 tokens), 12.5 GiB for "
        "the fullest trained (11200 tokens), measured/planned 0.96"
    ) in lines
    assert "engines     graph 64.0 MiB, kv_cache 20.00 GiB, weight 3.25 GiB" in lines  # each part's largest report
    assert "  upload:   wandb sync /w/offline-run-x" in lines and not any(
        line.startswith("checkpoints") for line in lines
    )
    assert "  metrics.jsonl   every metric of every step" in lines and "  plots           reward_curve.png" in lines
    assert len(lines) <= 24  # one screen


def test_summary_names_every_file_of_the_run_dir_and_speaks_of_workers_on_cpu(tmp_path):
    run = tmp_path / "run"
    write_metrics(run, [0.1, 0.4])
    for name in ("main.log", "config.yaml", "samples.jsonl", "result.json", "env.json", "placement.json"):
        (run / name).write_text("{}")
    (run / "logs").mkdir()
    for name in ("router.log", "engine_0.log", "workers.log"):
        (run / "logs" / name).write_text("")
    (run / "checkpoints").mkdir()
    result = {"status": "completed", "phase": "done", "rollouts_completed": 2, "start_rollout": 0, "num_rollout": 2}
    result |= {"elapsed_s": 9.0, "run_dir": str(run), "device": "cpu", "outputs": {"wandb": "/w/offline-run-x"}}
    lines = render_summary(result, checkpoint_dir=str(run / "checkpoints")).splitlines()
    files = [line.split()[0] for line in lines[lines.index(f"run dir     {run}") + 1 :] if line.startswith("  ")]
    assert files == [
        "main.log",
        "config.yaml",
        "metrics.jsonl",
        "samples.jsonl",
        "result.json",
        "env.json",
        "placement.json",
        "logs/",
    ]
    assert "  logs/           engine_0.log, router.log, workers.log" in lines
    assert f"checkpoints {run / 'checkpoints'}" in lines and "wandb       /w/offline-run-x" in lines
    training = next(line for line in lines if line.startswith("training"))
    assert (
        training == "training    2000 tokens/s, 200.00 TFLOP/s per trainer worker, MFU 20.0% (mean of 1 rollout steps)"
    )
    assert "GPU" not in training


def test_sweep_callback_writes_one_comparison_plot(tmp_path):
    sweep = tmp_path / "sweep"
    for job, rewards in (("0", [0.1, 0.2]), ("1", [0.3, 0.6]), ("10", [0.0, 0.1])):
        write_metrics(sweep / job, rewards)
        (sweep / job / ".hydra").mkdir()
        (sweep / job / ".hydra" / "overrides.yaml").write_text(f"- algo.eps_clip=0.{job}\n- hydra.verbose=false\n")
    assert list(sweep_runs(sweep)) == ["0: algo.eps_clip=0.0", "1: algo.eps_clip=0.1", "10: algo.eps_clip=0.10"]
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert (sweep / "sweep_rewards.png").stat().st_size > 10_000


def test_off_a_terminal_one_line_per_rollout_step_and_slow_phases_in_the_log(monkeypatch, caplog):
    out = io.StringIO()
    clock = iter([0.0, 12.5, 13.0, 13.5])
    monkeypatch.setattr("slime.tracking.progress.time.monotonic", lambda: next(clock))
    caplog.set_level(logging.INFO, logger="slime.tracking.progress")
    progress = RunProgress(total=5, live=False, console=Console(file=out, width=120), slow_phase_s=10)
    progress.start()  # no display off a terminal
    progress.begin(0)
    progress.on_phase("rollout", 0)  # t=0
    progress.on_phase("train", 0)  # t=12.5: the rollout phase was slow, so it gets a record
    progress.on_phase("weight_sync", 0)  # t=13: training took 0.5 s, no record
    progress.step_done(0, {"rollout/raw_reward": 0.25, "train/pg_loss": -0.01, "perf/step_time": 13.4})
    progress.close("done")
    assert out.getvalue().splitlines() == ["rollout    0/5  reward 0.250  pg_loss -0.0100  13.40s/step"]
    assert [r.getMessage() for r in caplog.records] == ["rollout 0 generating took 12.5s"]


def test_live_progress_shows_the_phase_under_way_and_the_last_step():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    progress = RunProgress(total=5, live=True, steps_per_rollout=2, console=console)
    progress.start()
    progress.on_phase("startup", None)
    assert progress.display.tasks[0].description == "starting Ray, the engines and the trainers..."
    progress.begin(2)
    progress.on_phase("weight_sync", -1)
    assert progress.display.tasks[0].description == "initial weight push..."
    progress.on_phase("train", 2)
    assert progress.display.tasks[0].description == "rollout 2: training (2 optimizer steps)..."
    progress.step_done(2, {"rollout/raw_reward": 0.5, "perf/step_time": 2.0})
    assert progress.display.tasks[0].completed == 3
    assert progress.display.last_step == "last step: rollout 2  reward 0.500  2.00s/step"
    progress.eval_done(3, {"eval/digit": 0.75, "eval/digit-pass@1": 0.75, "eval/step": 3})
    assert progress.display.last_step == "last step: rollout 2  reward 0.500  2.00s/step  |  eval eval/digit 0.7500"
    progress.close("done")
    assert progress.display is None and progress.showing is False
    assert "rollout    2/5  reward 0.500  2.00s/step" in out.getvalue()  # the step's line, above the display


def test_summary_of_a_run_killed_mid_line(tmp_path):
    run = tmp_path / "run"
    write_metrics(run, [0.2, 0.3])
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"rollout/step": 2, "rollout/raw_re')  # a forced exit cut the last write
    result = {"status": "interrupted", "phase": "train", "rollouts_completed": 2, "start_rollout": 0}
    text = render_summary({**result, "num_rollout": 5, "elapsed_s": 9.0, "run_dir": str(run)})
    assert "Run interrupted in phase train: 2 rollout steps (0 -> 2 of 5) in 9.0s" in text
    assert "first 0.2000 -> last 0.3000" in text
