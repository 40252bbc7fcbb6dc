"""The reward benchmark runs with its math half left out (its figures are read by hand: docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent / "benchmarks" / "bench_reward.py"


def test_code_checks_alone(shared_data):
    out = subprocess.run([sys.executable, str(BENCH), "--math", "0", "--code", "3", "--threads", "2", "--shared", str(shared_data)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["math_calls"] == 0 and row["math_p50_ms"] is None and row["math_worker_cpu_ms_per_call"] is None
    assert row["code_runs"] == 3 and row["code_passed"] == 3 and row["code_runs_per_s"] > 0
