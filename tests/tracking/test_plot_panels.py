"""training_curves.png: a panel only for what metrics.jsonl holds, and every loss on its own axis."""

from __future__ import annotations

import json

import matplotlib.image
import matplotlib.pyplot as plt

from slime.tracking.jsonl import read_jsonl
from slime.tracking.plot import plot_training_curves, training_figure


def cpu_run_records(rollouts: int = 3, k: int = 2) -> list[dict]:
    """What a CPU GRPO run logs (the embedded run's keys): no MFU, no trainer peak memory, the engine's weights."""
    records = []
    for r in range(rollouts):
        for j in range(k):
            step = {"train/pg_loss": -0.01 * (j + 1), "train/grad_norm": 0.8 + 0.1 * r, "train/ppo_kl": 1e-4}
            records.append({"rollout/step": r, "train/step": r * k + j, **step})
        records.append(
            {
                "rollout/step": r,
                "rollout/raw_reward": 0.1 * r,
                "rollout/response_len/mean": 2.0,
                "perf/rollout_time": 1.0,
                "perf/train_time": 0.2,
                "perf/step_time": 1.3,
                "perf/train_tflops": 0.01,
                "perf/engine_gib/weight": 0.0004,
            }
        )
    return records


def panels(records: list[dict]) -> dict[str, list[str]]:
    """{title: the labels of its lines} of the figure's visible panels, in order."""
    fig = training_figure(records)
    try:
        return {ax.get_title(): [line.get_label() for line in ax.get_lines()] for ax in fig.axes if ax.get_visible()}
    finally:
        plt.close(fig)


def test_a_cpu_run_gets_no_mfu_or_gpu_memory_panel_and_each_loss_its_own_axis():
    shown = panels(cpu_run_records())
    assert list(shown) == [
        "reward",
        "response length (tokens)",
        "policy loss",
        "grad norm",
        "KL to the rollout policy",
        "phase time per rollout step (s)",
    ]
    assert shown["policy loss"] == ["train/pg_loss"] and shown["grad norm"] == ["train/grad_norm"]
    assert not any("MFU" in title or "memory" in title for title in shown)


def test_a_gpu_ppo_run_adds_its_losses_mfu_and_memory_panels():
    records = cpu_run_records()
    for record in records:
        if "train/step" in record:
            record.update({"train/kl_loss": 0.02, "train/entropy_loss": 1.5, "train/value_loss": 0.3})
            record["train/critic-grad_norm"] = 0.5
        else:
            record.update({"perf/mfu": 0.3, "perf/peak_gib/train": 20.0, "perf/peak_gib/log_probs": 12.0})
    shown = panels(records)
    assert list(shown) == [
        "reward",
        "response length (tokens)",
        "policy loss",
        "KL loss",
        "entropy",
        "value loss",
        "grad norm",
        "KL to the rollout policy",
        "phase time per rollout step (s)",
        "MFU (training, per GPU)",
        "GPU memory: peak per phase, engines' reports (GiB)",
    ]
    # one loss per axis: no axis holds two of them
    losses = {"train/pg_loss", "train/kl_loss", "train/entropy_loss", "train/value_loss"}
    assert all(len(losses & set(labels)) <= 1 for labels in shown.values())
    assert shown["grad norm"] == ["train/grad_norm", "train/critic-grad_norm"]
    assert shown["GPU memory: peak per phase, engines' reports (GiB)"] == [
        "perf/engine_gib/weight",
        "perf/peak_gib/log_probs",
        "perf/peak_gib/train",
    ]


def test_the_png_holds_the_panels_of_the_metrics_file(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in cpu_run_records()))
    png = plot_training_curves(metrics, tmp_path / "training_curves.png")
    assert png is not None and png.stat().st_size > 10_000
    # six panels fill two rows of four: the figure is two rows high (90 dpi, 4 in a row)
    height, width = matplotlib.image.imread(png).shape[:2]
    assert (width, height) == (20 * 90, 8 * 90)
    assert len(panels(read_jsonl(metrics))) == 6
