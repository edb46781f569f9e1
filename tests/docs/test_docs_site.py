"""The documentation: the site builds with `mkdocs build --strict` (a broken link or anchor, or a page missing from the
nav, fails), every relative link in README.md resolves, every `docs/<page>.md#anchor` the code cites exists, and the
README stays one screen wide and a few screens long.

Anchors are checked as both renderers make them: the site's (python-markdown's toc extension, as mkdocs runs it) and
GitHub's, which must agree for every heading so one link works in both.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import markdown
import yaml

from tests.helpers.compose import ROOT

DOCS = ROOT / "docs"
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CITING = ("slime", "tools", "tests", "conf", "recipes", "hydra_plugins")


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # mkdocs-material prints a banner otherwise
    )


def headings(text: str) -> list[str]:
    """The headings' text of a markdown page, fenced and indented code left out."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("    "):
            match = HEADING.match(line)
            if match:
                found.append(match.group(2))
    return found


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lower-cased, punctuation removed, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def site_anchors(text: str) -> list[str]:
    """The anchors the site gives a page's headings (python-markdown's toc extension, as mkdocs)."""
    md = markdown.Markdown(extensions=["toc", "tables"])
    md.convert(text)
    flat, stack = [], list(md.toc_tokens)
    while stack:
        token = stack.pop(0)
        flat.append(token["id"])
        stack[:0] = token["children"]
    return flat


def anchors(path: Path) -> set[str]:
    return set(site_anchors(path.read_text()))


def test_the_site_builds_strict(tmp_path):
    proc = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file() and (
        tmp_path / "site" / "architecture" / "index.html"
    ).is_file()


def test_a_broken_link_fails_the_build(tmp_path):
    """The strict build is a real check: a copy of the site with one bad anchor fails it."""
    shutil.copytree(DOCS, tmp_path / "docs")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(tmp_path / "docs")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](architecture.md#no-such-heading)\n")
    proc = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0 and "no-such-heading" in proc.stdout + proc.stderr


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages, stack = set(), list(config["nav"])
    while stack:
        item = stack.pop()
        for value in item.values() if isinstance(item, dict) else [item]:
            stack.extend(value) if isinstance(value, list) else pages.add(value)
    assert pages == {p.name for p in DOCS.glob("*.md")}


def test_github_and_the_site_give_every_heading_the_same_anchor():
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        text = page.read_text()
        github = [github_slug(h) for h in headings(text)]
        assert github == site_anchors(text), f"{page.name}: a heading GitHub and the site anchor differently"
        assert len(set(github)) == len(github), f"{page.name}: two headings share an anchor"


def test_every_relative_link_in_the_readme_resolves():
    own = anchors(README)
    broken = []
    for target in LINK.findall(README.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (ROOT / path) if path else README
        if not file.is_file():
            broken.append(target)
        elif anchor and anchor not in (own if not path else anchors(file) if file.suffix == ".md" else set()):
            broken.append(target)
    assert broken == []


def test_every_docs_page_the_code_cites_exists_with_its_anchor():
    files = [README] + [p for d in CITING for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".yaml", ".sh")]
    broken = []
    for file in files:
        for page, anchor in CITED.findall(file.read_text()):
            target = DOCS / page
            if not target.is_file() or (anchor and anchor not in anchors(target)):
                broken.append(f"{file.relative_to(ROOT)}: docs/{page}#{anchor}")
    assert broken == []
    assert any(CITED.search(p.read_text()) for p in (ROOT / "slime" / "driver").glob("*.py"))


def test_the_readme_is_short_and_narrow():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    assert [n + 1 for n, line in enumerate(lines) if len(line) > 120] == []
