"""tools/bench_sync.py --tiny --verify on the CPU: a real engine process, each mode's unverified push taking turns
with the same push verified in it and beside generation; the verification table names both kinds with figures
(never timed assertions: the numbers are the bench's to report)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers.tools import ROOT


def test_the_verification_table_has_both_kinds_of_check_with_their_figures(tmp_path):
    command = [sys.executable, str(ROOT / "tools" / "bench_sync.py"), "--tiny", "--verify", "--modes", "tensor"]
    proc = subprocess.run(
        [*command, "--repeats", "2", "--work-dir", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    number = r"-?\d+\.\d"
    for kind, awaited in (("verified in the push", r"0\.0"), ("verified beside generation", number)):
        row = rf"\| tensor \| 1024 \| {kind} \| ({number}) \| ({number}) \| {number} \| {number}% \| ({number}) \| ({awaited}) \|"
        found = re.search(row, proc.stdout)
        assert found, proc.stdout[-3000:]
        assert float(found.group(3)) > 0  # the check read the engine's digests and the trainer's
