"""The benchmark scripts still run end to end (their numbers are read by people, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_launch_benchmark_smoke(tmp_path):
    out = tmp_path / "launch.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "launch.py"), "--repeats", "1", "--steps", "20",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "clustersdk (warm)" in proc.stdout and "torchrun" in proc.stdout
    medians = json.loads(out.read_text())
    assert medians, "no medians written"
