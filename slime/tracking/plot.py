"""The reward curve PNG written at the end of a run, from metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from slime.tracking.jsonl import read_jsonl


def plot_reward_curve(metrics_path: str | Path, png_path: str | Path) -> Path | None:
    """Plot rollout/raw_reward (and eval rewards) against rollout/step; None when nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(metrics_path)
    train = [(r["rollout/step"], r["rollout/raw_reward"]) for r in records if "rollout/raw_reward" in r]
    evals = {k for r in records for k in r if k.startswith("eval/") and k != "eval/step" and k.count("/") == 1}
    if not train:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(*zip(*train), marker="o", markersize=3, label="rollout/raw_reward")
    for key in sorted(evals):
        points = [(r["eval/step"], r[key]) for r in records if key in r]
        ax.plot(*zip(*points), marker="s", linestyle="--", label=key)
    ax.set_xlabel("rollout step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.05, 1.05) if all(0 <= v <= 1 for _, v in train) else None
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("reward curve")
    fig.tight_layout()
    png_path = Path(png_path)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path
