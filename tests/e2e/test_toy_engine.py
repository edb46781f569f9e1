"""A part added from outside the project: a toy engine is one package (its spec.py, its options and its class) and
one YAML, and the embedded default runs through it with nothing of slime/ or conf/ touched (slime.registry finds the
package's record from the config value naming it; slime/run_schema.py joins its options section, `rollout.toy`, to
the run's schema)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from tests.helpers.runs import main_py, rewards, run_concurrently

pytestmark = pytest.mark.slow

SPEC = """
from slime.registry import EngineFacts, Spec
from toy_engine.config import ToyOptions

SPECS = (
    Spec(
        seam="rollout.engine",
        name="toy",
        target=".engine.ToyEngine",
        facts=EngineFacts(kind="toy engine"),
        config=ToyOptions,
    ),
)
"""
CONFIG = """
from dataclasses import dataclass, field


@dataclass(kw_only=True)
class ToyConfig:
    mark: str = "started"  # what each engine writes in its mark file


@dataclass(kw_only=True)
class ToyOptions:
    toy: ToyConfig = field(default_factory=ToyConfig)
"""
ENGINE = '''
from pathlib import Path

from slime.engine.hf.engine import HFEngine


class ToyEngine(HFEngine):
    """The built-in engine, leaving a mark of each start in the run's logs (its text: `rollout.toy.mark`)."""

    @classmethod
    def config_from(cls, rollout, **kwargs):
        config = super().config_from(rollout, **kwargs)
        config.mark = rollout.toy.mark
        return config

    def launch(self):
        Path(self.launch_spec.log_dir, f"toy_engine_{self.rank}.started").write_text(self.config.mark)
        super().launch()
'''
YAML = """
# A toy engine: the built-in one's options and its own, its class from the package toy_engine
defaults:
  - hf
engine: toy_engine
toy:
  mark: from the toy's YAML
"""


def toy_engine(root: Path) -> list[str]:
    """The package and the YAML under `root`; the overrides that choose them."""
    package = root / "toy_engine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spec.py").write_text(textwrap.dedent(SPEC))
    (package / "config.py").write_text(textwrap.dedent(CONFIG))
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
    marks = list((tmp_path / "toy").rglob("toy_engine_*.started"))
    assert [p.name for p in marks] == ["toy_engine_0.started"]
    assert marks[0].read_text() == "from the toy's YAML"  # the engine read its own options section
    assert not list((tmp_path / "hf").rglob("toy_engine_*.started"))
    assert len(rewards(tmp_path / "toy")) == 3 and rewards(tmp_path / "toy") == rewards(tmp_path / "hf")


def test_the_toy_engines_options_are_typed_like_the_projects(tmp_path, monkeypatch):
    """Its section is part of the run's schema: `--cfg job` shows it, and a misspelt key under it is a configuration
    error naming the key, as under the built-in engine's."""
    chosen = toy_engine(tmp_path / "outside")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'outside'}")
    printed = main_py(tmp_path / "cfg", *chosen, "rollout.toy.mark=from_the_command_line", "--cfg", "job")
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert yaml.safe_load(printed.stdout)["rollout"]["toy"] == {"mark": "from_the_command_line"}
    typo = main_py(tmp_path / "typo", *chosen, "rollout.toy.marc=x")
    assert typo.returncode == 2, typo.stderr[-3000:]
    assert "rollout.toy.marc=x: no such key" in typo.stderr and "Traceback" not in typo.stderr
