"""The repository stands alone and speaks to its users: no file cites a document outside it, and none uses the words
of how the project is built (ticket numbers, borrowed machines, the design notes it started from).

Scanned: README.md, mkdocs.yml, pyproject.toml, main.py and every text file under docs/, slime/, tools/, tests/,
conf/, recipes/ and hydra_plugins/. The one line exempt is this module's own PATTERN_TEXT. Upstream references such as
`THUDM/slime#1558` are fine.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.compose import ROOT

PATTERN_TEXT = r"REFERENCE(\.md| §)|DESIGN\.md|the[ ]seeds|seeds'|seed flags|\blent\b|issue [0-9]+|§"
PATTERN = re.compile(PATTERN_TEXT, re.IGNORECASE)
FILES = ("README.md", "mkdocs.yml", "pyproject.toml", "main.py")
FOLDERS = ("docs", "slime", "tools", "tests", "conf", "recipes", "hydra_plugins")
TEXT = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".json", ".cfg", ".ini"}
SKIP = {"__pycache__", ".venv", "sglang-cpu"}


def scanned(root: Path = ROOT) -> list[Path]:
    paths = [root / name for name in FILES if (root / name).is_file()]
    for folder in FOLDERS:
        paths += sorted(
            p
            for p in (root / folder).rglob("*")
            if p.suffix in TEXT and p.is_file() and not SKIP & set(p.relative_to(root).parts)
        )
    return paths


def offending_lines(paths: list[Path], root: Path = ROOT) -> list[str]:
    own = Path(__file__).resolve()
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if PATTERN.search(line) and not (path.resolve() == own and line.startswith("PATTERN_TEXT = ")):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()[:100]}")
    return found


def test_no_outside_document_and_no_build_words():
    paths = scanned()
    assert len(paths) > 300 and ROOT / "README.md" in paths and ROOT / "docs" / "architecture.md" in paths
    assert offending_lines(paths) == []


def test_the_scan_finds_each_kind(tmp_path):
    """Each kind of line is found; the samples are spelt with "~" (removed below), so this module holds none."""
    (tmp_path / "slime").mkdir()
    lines = [
        "see REFER~ENCE.md \u00a72.2",
        "formulas (REFER~ENCE \u00a73.1)",
        "the se~eds' --rollout-seed",
        "run on the le~nt GPU",
        "Iss~ue 24's acceptance",
        "DESI~GN.md's seams",
        "fine: THUDM/slime#1558, equivalent, seed=1234, issues.append(x)",
    ]
    (tmp_path / "slime" / "module.py").write_text("\n".join(line.replace("~", "") for line in lines) + "\n")
    found = offending_lines(scanned(tmp_path), tmp_path)
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "4", "5", "6"]
