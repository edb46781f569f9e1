"""The hostile-input suite: bad config, data, user code and runtime conditions, each named in its error.

Every case asserts the exit status (subprocess cases) or the error type (unit-level cases), that the message
names the culprit (key, file:line, function, URL), and that nothing earlier was damaged (a prior run's
config.yaml, metrics and checkpoint; validation creates no run directory). Most cases are unit-level calls;
`main.py` runs only where the exit status itself is the point.

    test_hostile_config.py     types, ranges, paths, batch and GPU arithmetic, conflicts, unknown keys, CLI exit 2
    test_hostile_data.py       prompt files: directories, empty prompts, NaN, huge lines, encodings, extensions
    test_hostile_user_code.py  reward hooks that fail to import, take the wrong arguments, raise, return
                               NaN/inf/str/dicts without a key; a generate function that hangs (watchdog)
    test_hostile_runtime.py    router unreachable, engine killed or port taken on start, disk full and
                               SIGTERM during a checkpoint save

Cases that live elsewhere and are not repeated here:

    tests/test_config.py            batch arithmetic (global_batch_size=100), GPU counts, missing paths, KL
                                    without reference, temperature 0, checkpoint mismatch, CLI exit 2 on typos
    tests/test_config_hooks.py      misspelled hook paths (did you mean), generator keys, save_hf templates
    tests/test_config_passthrough.py router flags and sglang server args against their real parsers
    tests/rollout/test_data.py      bad JSON, missing keys, wrong field types, non-UTF-8 bytes, empty files
    tests/rollout/test_rewards.py   a reward that raises or returns NaN (per sample and per group)
    tests/engine/test_engine_base.py engine crash with log tail, startup timeout, busy ports skipped
    tests/test_interrupts.py        SIGINT/SIGTERM in every phase of a real run
    tests/test_watchdog.py          a hung trainer rank in a real run
    tests/reliability/test_atomic_checkpoint.py a save killed at each file; SIGKILL of a real run in its save
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from slime.config import ConfigError, validate
from tests.conftest import typed_config


def problems_for(overrides: list[str], output_dir: Path) -> dict[str, str]:
    """Validation's problems by key (several joined by " | "); validation must not create the run directory."""
    with pytest.raises(ConfigError) as info:
        validate(typed_config(overrides, str(output_dir)))
    assert not output_dir.exists(), "validation created the run directory"
    found: dict[str, str] = {}
    for problem in info.value.problems:  # a key may have several problems
        found[problem.key] = f"{found[problem.key]} | {problem}" if problem.key in found else str(problem)
    return found


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with its sha256: compare before and after to show nothing was damaged."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


@pytest.fixture
def earlier_run(tmp_path) -> Path:
    """A finished run's directory: config, metrics, result and a checkpoint of rollout 0."""
    run = tmp_path / "earlier"
    ckpt = run / "checkpoints"
    (ckpt / "iter_0000000" / "model").mkdir(parents=True)
    (ckpt / "iter_0000000" / "model" / "config.json").write_text('{"model_type": "qwen3"}')
    (ckpt / "latest_checkpointed_iteration.txt").write_text("0")
    (run / "config.yaml").write_text("seed: 1234\n")
    (run / "metrics.jsonl").write_text('{"rollout/raw_reward": 0.5, "rollout_id": 0}\n')
    (run / "result.json").write_text('{"status": "completed"}')
    return run
