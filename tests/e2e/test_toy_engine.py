"""A part added from outside the project: a toy engine is one package (its spec.py and its class) and one YAML, and
the embedded default runs through it with nothing of slime/ or conf/ touched (slime.registry finds the package's
record from the config value naming it)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers.runs import main_py, rewards, run_concurrently

pytestmark = pytest.mark.slow

SPEC = """
from slime.registry import EngineFacts, Spec

SPECS = (Spec(seam="rollout.engine", name="toy", target=".engine.ToyEngine", facts=EngineFacts(kind="toy engine")),)
"""
ENGINE = '''
from pathlib import Path

from slime.engine.hf.engine import HFEngine


class ToyEngine(HFEngine):
    """The built-in engine, leaving a mark of each start in the run's logs."""

    def launch(self):
        Path(self.launch_spec.log_dir, f"toy_engine_{self.rank}.started").write_text("started")
        super().launch()
'''
YAML = """
# A toy engine: the built-in one's options, its class from the package toy_engine
defaults:
  - hf
engine: toy_engine
"""


def toy_engine(root: Path) -> list[str]:
    """The package and the YAML under `root`; the overrides that choose them."""
    package = root / "toy_engine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spec.py").write_text(textwrap.dedent(SPEC))
    (package / "engine.py").write_text(textwrap.dedent(ENGINE))
    (root / "conf" / "rollout").mkdir(parents=True)
    (root / "conf" / "rollout" / "toy.yaml").write_text(textwrap.dedent(YAML))
    return ["rollout=toy", f"hydra.searchpath=[file://{root / 'conf'}]"]


def test_the_embedded_default_runs_through_a_toy_engine_added_as_one_package_and_one_yaml(tmp_path, monkeypatch):
    chosen = toy_engine(tmp_path / "outside")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'outside'}")
    runs = run_concurrently(
        {
            name: lambda name=name, extra=extra: main_py(tmp_path / name, "train.num_rollout=3", *extra)
            for name, extra in {"toy": chosen, "hf": []}.items()
        },
        max_workers=2,
    )
    for name, proc in runs.items():
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
    assert "toy engine" in runs["toy"].stdout  # the plan's stack names the record's kind
    assert [p.name for p in (tmp_path / "toy").rglob("toy_engine_*.started")] == ["toy_engine_0.started"]
    assert not list((tmp_path / "hf").rglob("toy_engine_*.started"))
    assert len(rewards(tmp_path / "toy")) == 3 and rewards(tmp_path / "toy") == rewards(tmp_path / "hf")
