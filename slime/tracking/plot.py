"""PNG plots from metrics.jsonl: written at each save and at the end of a run, and once per sweep.

reward_curve.png      rollout/raw_reward (and eval means) against rollout/step
training_curves.png   a panel per quantity the run logged (PANELS), four to a row: reward, response length (mean,
                      min-max band), each loss on its own axis (policy, KL, entropy, value), grad norm, the policy's
                      KL to the rollout (train/ppo_kl), phase timings (perf/*_time per rollout step, stacked), MFU, and
                      GPU memory (the trainer's peaks per phase, beside the engines' reports); a quantity this run did
                      not log (MFU and GPU memory on CPU, a critic's loss without PPO) gets no panel
sweep_rewards.png     (sweep directory) every job's reward curve, labelled by its overrides
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

from slime.tracking.jsonl import read_jsonl

matplotlib.use("Agg")  # files only, never a display: chosen before pyplot picks a backend
import matplotlib.pyplot as plt  # noqa: E402

# The phases of a rollout step, as the driver times them (perf/step_time is their sum plus overheads);
# train_time covers log-probs, advantages and the optimizer steps of every role.
PHASE_TIMES = ("perf/rollout_time", "perf/train_time", "perf/save_model_time", "perf/update_weights_time")


def series(records: list[dict[str, Any]], key: str, axis: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key` against `axis`, over the records that have both (numbers only)."""
    points = [(r[axis], r[key]) for r in records if axis in r and isinstance(r.get(key), int | float)]
    return [p[0] for p in points], [p[1] for p in points]


def eval_keys(records: list[dict[str, Any]]) -> list[str]:
    """The eval mean rewards, `eval/<name>` (not their pass@k, lengths or ratios: `eval/<name>-x`, `eval/<name>/x`)."""
    return sorted(
        {
            k
            for r in records
            for k in r
            if k.startswith("eval/") and k != "eval/step" and k.count("/") == 1 and "-" not in k
        }
    )


def plot_reward_curve(metrics_path: str | Path, png_path: str | Path) -> Path | None:
    """Plot rollout/raw_reward (and eval rewards) against rollout/step; None when nothing to plot."""
    records = read_jsonl(metrics_path, tolerant=True)
    steps, rewards = series(records, "rollout/raw_reward", "rollout/step")
    if not steps:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    _reward_panel(ax, records)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)


def _reward_panel(ax, records: list[dict[str, Any]], title: str = "reward") -> None:
    steps, rewards = series(records, "rollout/raw_reward", "rollout/step")
    ax.plot(steps, rewards, marker="o", markersize=3, label="rollout/raw_reward")
    for key in eval_keys(records):
        ax.plot(*series(records, key, "eval/step"), marker="s", linestyle="--", label=key)
    ax.set_xlabel("rollout step")
    ax.set_ylabel("mean reward")
    if rewards and all(0 <= v <= 1 for v in rewards):
        ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    ax.set_title(title)


def _lines(ax, records, keys: tuple[str, ...], axis: str, title: str) -> None:
    for key in keys:
        x, y = series(records, key, axis)
        if x:
            ax.plot(x, y, marker="o", markersize=2, label=key)
    ax.set_title(title)
    ax.set_xlabel(axis)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _length_panel(ax, records, title: str) -> None:
    _lines(ax, records, ("rollout/response_len/mean",), "rollout/step", title)
    x, low = series(records, "rollout/response_len/min", "rollout/step")
    x2, high = series(records, "rollout/response_len/max", "rollout/step")
    if x and x == x2:
        ax.fill_between(x, low, high, alpha=0.2, label="min-max")


def _timing_panel(ax, records, title: str) -> None:
    rows = [r for r in records if "perf/step_time" in r and "rollout/step" in r]
    keys = [k for k in PHASE_TIMES if any(k in r for r in rows)]
    ax.set_title(title)
    ax.set_xlabel("rollout/step")
    ax.grid(alpha=0.3)
    x = [r["rollout/step"] for r in rows]
    bottom = [0.0] * len(rows)
    for key in keys:  # stacked bars: one per rollout step, one colour per phase
        heights = [r.get(key, 0.0) for r in rows]
        ax.bar(x, heights, bottom=bottom, width=0.9, label=key[5:-5])
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.plot(x, [r["perf/step_time"] for r in rows], color="black", marker=".", linewidth=1, label="step")
    ax.legend(fontsize=6, loc="upper left")


MEMORY = ("perf/peak_gib/", "perf/engine_gib/")


def _memory_panel(ax, records, title: str) -> None:
    keys = tuple(sorted({k for r in records for k in r if k.startswith(MEMORY)}))
    _lines(ax, records, keys, "rollout/step", title)


@dataclasses.dataclass(frozen=True)
class Panel:
    """One panel of training_curves.png: shown when any of `keys` (or a key starting with one ending in '/') is
    logged against `axis`; `draw(ax, records, title)` draws it (None: a line per key)."""

    title: str
    keys: tuple[str, ...]
    axis: str = "train/step"
    draw: Callable[..., None] | None = None

    def shown(self, records: list[dict[str, Any]]) -> bool:
        return any(
            self.axis in r and any(k.startswith(key) if key.endswith("/") else k == key for key in self.keys)
            for r in records
            for k in r
        )

    def render(self, ax, records: list[dict[str, Any]]) -> None:
        if self.draw is not None:
            self.draw(ax, records, self.title)
        else:
            _lines(ax, records, self.keys, self.axis, self.title)


# In order. Each loss has its own axis: their scales differ by orders of magnitude (a policy loss near 0 beside a
# grad norm near 1 reads as a flat line). GPU memory shows with the trainer's peaks, measured on CUDA only (a CPU
# run's engines report their weights alone).
PANELS = (
    Panel("reward", ("rollout/raw_reward",), "rollout/step", _reward_panel),
    Panel("response length (tokens)", ("rollout/response_len/mean",), "rollout/step", _length_panel),
    Panel("policy loss", ("train/pg_loss",)),
    Panel("KL loss", ("train/kl_loss",)),
    Panel("entropy", ("train/entropy_loss",)),
    Panel("value loss", ("train/value_loss",)),
    Panel("grad norm", ("train/grad_norm", "train/critic-grad_norm")),
    Panel("KL to the rollout policy", ("train/ppo_kl",)),
    Panel("phase time per rollout step (s)", ("perf/step_time",), "rollout/step", _timing_panel),
    Panel("MFU (training, per GPU)", ("perf/mfu",), "rollout/step"),
    Panel("GPU memory: peak per phase, engines' reports (GiB)", ("perf/peak_gib/",), "rollout/step", _memory_panel),
)
COLUMNS = 4


def training_figure(records: list[dict[str, Any]]):
    """The matplotlib Figure of training_curves.png: one panel per quantity the records hold (PANELS), COLUMNS to
    a row, the empty places of the last row hidden."""
    panels = [panel for panel in PANELS if panel.shown(records)]
    rows = -(-len(panels) // COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(5 * COLUMNS, 4 * rows), dpi=90, squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        panel.render(ax, records)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def plot_training_curves(metrics_path: str | Path, png_path: str | Path) -> Path | None:
    """training_figure of the run's metrics; None when no rollout was logged yet."""
    records = read_jsonl(metrics_path, tolerant=True)
    if not series(records, "rollout/raw_reward", "rollout/step")[0]:
        return None
    fig = training_figure(records)
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)


def write_run_plots(metrics_path: str | Path, run_dir: str | Path) -> list[Path]:
    """Every run plot into `run_dir`; returns the files written."""
    run_dir = Path(run_dir)
    if not Path(metrics_path).exists():
        return []
    written = [
        plot_reward_curve(metrics_path, run_dir / "reward_curve.png"),
        plot_training_curves(metrics_path, run_dir / "training_curves.png"),
    ]
    return [p for p in written if p is not None]


def plot_sweep_rewards(runs: dict[str, Path], png_path: str | Path) -> Path | None:
    """One reward curve per run (label -> its metrics.jsonl); None when no run logged a reward."""
    return plot_run_curves(runs, png_path, keys=("rollout/raw_reward",), title=f"sweep: {len(runs)} runs")


def plot_run_curves(runs: dict[str, Path], png_path: str | Path, *, keys: tuple[str, ...], title: str) -> Path | None:
    """Each run's (label -> its metrics.jsonl) curve of each key, against its own step axis (`eval/...` keys
    against eval/step, the rest against rollout/step); None when no run logged any of them."""
    curves = {}
    for label, metrics_path in runs.items():
        if not Path(metrics_path).exists():
            continue
        records = read_jsonl(metrics_path, tolerant=True)
        for key in keys:
            x, y = series(records, key, "eval/step" if key.startswith("eval/") else "rollout/step")
            if x:
                curves[label if len(keys) == 1 else f"{label}: {key}"] = (x, y)
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for label, (x, y) in curves.items():
        ax.plot(x, y, marker="o", markersize=2 if len(x) > 20 else 5, label=label)
    ax.set_xlabel("rollout step")
    ax.set_ylabel(keys[0] if len(keys) == 1 else "value")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)
