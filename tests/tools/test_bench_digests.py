"""tools/bench_digests.py --tiny on the CPU: one row per digest path, each with its figures (never timed assertions:
the numbers are the bench's to report)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers.tools import ROOT


def test_every_digest_path_has_a_row_with_its_figures():
    command = [sys.executable, str(ROOT / "tools" / "bench_digests.py"), "--tiny", "--repeats", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(
        r"^\| (block sums[^|]*|fold[^|]*|digests[^|]*) \| (\d+\.\d\d) \| \d+ \| \d+\.\d\d \|$", proc.stdout, re.M
    )
    assert len(rows) == 6 and all(float(ms) > 0 for _, ms in rows), proc.stdout
