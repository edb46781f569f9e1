"""hydra/launcher=ray_jobs is discovered: from a checkout by Hydra, and in the wheel's packages (a real sweep of Ray
Jobs through it: tests/e2e/test_ray_jobs_launcher.py)."""

from __future__ import annotations

import subprocess
import sys

import tomllib
from setuptools import find_namespace_packages

from tests.helpers.compose import ROOT


def test_plugin_is_discovered_from_the_checkout_and_packaged():
    """`--info plugins` lists it from a checkout; the wheel's package list includes it (namespace package)."""
    proc = subprocess.run(
        [sys.executable, "main.py", "--info", "plugins"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RayJobsLauncher" in proc.stdout
    assert not (ROOT / "hydra_plugins" / "__init__.py").exists()  # Hydra's namespace package has none
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_namespace_packages(where=str(ROOT), include=find["include"])
    assert find.get("namespaces", True) and "hydra_plugins.ray_jobs_launcher" in packages
