"""The README's tables name every option of every config group in conf/, and only real ones.

Options are the YAML files under each group's folder, nested ones by their relative path: recipes through
conf/recipe -> ../recipes (`gpu/qwen3_4b_grpo_math` for recipes/gpu/), the presets' parts as `sizes/embedded`. A group's
options are named either in the README's overview table (header `| group | options | ...`, the group in the first
cell, its options backticked in the second) or in a table of its own whose first header cell is "`<group>` option"
(the options backticked in each row's first cell).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.compose import CONF, ROOT

README = ROOT / "README.md"
TICKED = re.compile(r"`([^`]+)`")
OWN_TABLE = re.compile(r"^`([\w@/]+)` options?$")


def conf_options(conf: Path = CONF) -> dict[str, set[str]]:
    """{group: its options} for every folder of conf/ (the recipe link followed), nested options as `sub/name`."""
    groups = {}
    for group_dir in sorted(p for p in conf.iterdir() if p.is_dir()):
        files = sorted(group_dir.resolve().rglob("*.yaml"))
        groups[group_dir.name] = {f.relative_to(group_dir.resolve()).with_suffix("").as_posix() for f in files}
    return groups


def tables(markdown: str) -> list[list[list[str]]]:
    """Every table of `markdown` as rows of cells (the header first, the |---| line left out)."""
    found, current = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def documented_options(markdown: str) -> dict[str, set[str]]:
    """{group: the options the README's tables name for it} (see the module docstring)."""
    named: dict[str, set[str]] = {}
    for table in tables(markdown):
        header, rows = table[0], table[1:]
        if header[0] == "group":
            for row in rows:
                group = TICKED.findall(row[0])
                if len(group) == 1 and len(row) > 1:
                    named.setdefault(group[0], set()).update(TICKED.findall(row[1]))
            continue
        own = OWN_TABLE.match(header[0])
        if own:
            for row in rows:
                named.setdefault(own.group(1), set()).update(TICKED.findall(row[0]))
    return named


def missing_and_unknown(options: dict[str, set[str]], named: dict[str, set[str]]) -> tuple[list[str], list[str]]:
    """(`group=option`s no table names, names a group's tables give that are no option of it)."""
    missing = [f"{g}={o}" for g, opts in sorted(options.items()) for o in sorted(opts - named.get(g, set()))]
    unknown = [f"{g}={o}" for g, opts in sorted(named.items()) if g in options for o in sorted(opts - options[g])]
    return missing, unknown


def test_every_config_option_is_named_in_the_readme():
    options = conf_options()
    assert {"model", "preset", "algo", "cluster", "recipe", "rollout"} <= set(options)
    assert "gpu/qwen3_4b_grpo_math" in options["recipe"] and "sizes/embedded" in options["preset"]
    missing, unknown = missing_and_unknown(options, documented_options(README.read_text()))
    assert missing == [], f"options the README's tables do not name: {missing}"
    assert unknown == [], f"names in the README's option tables that are no option of their group: {unknown}"


def test_every_group_has_a_row_in_the_overview_table():
    overview = [t for t in tables(README.read_text()) if t[0][0] == "group"]
    assert len(overview) == 1, "one overview table of the config groups"
    rows = {g for row in overview[0][1:] for g in TICKED.findall(row[0])[:1]}
    assert set(conf_options()) <= rows


def test_the_check_finds_a_missing_and_an_unknown_option(tmp_path):
    """On a small conf tree and README: an option no table names and a stale name are both reported."""
    (tmp_path / "algo").mkdir()
    for name in ("grpo", "ppo"):
        (tmp_path / "algo" / f"{name}.yaml").write_text("name: x\n")
    (tmp_path / "cluster" / "gpu").mkdir(parents=True)
    (tmp_path / "cluster" / "gpu" / "big.yaml").write_text("device: cuda\n")
    readme = (
        "| group | options | what |\n|---|---|---|\n| `algo` | `grpo`, `gone` | x |\n\n"
        "| `cluster` option | layout |\n|---|---|\n| `gpu/big` | eight GPUs |\n"
    )
    missing, unknown = missing_and_unknown(conf_options(tmp_path), documented_options(readme))
    assert missing == ["algo=ppo"] and unknown == ["algo=gone"]
