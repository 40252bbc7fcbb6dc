"""A run directory written before issue 60's layout change resumes with today's `mentor run`.

``tests/data/old_run/run`` was written by mentor at 8514e4b (the last commit before issue 60's first merge,
when the CLI was ``mentor.cli`` in ``pipeline/cli/`` and the runner named every stage), by
``tests/data/old_run/make_old_run.py``: round 0 of the two-round offline workflow ``wf.yaml`` finished, round 1
not started (``--rounds 1``). Today's `mentor run` on a copy of it skips the five finished stages of round 0
(their done markers still match), leaves their files as they were and runs round 1, which comes out byte for byte
as a fresh run of the same workflow by today's code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "data" / "old_run"
INPUTS = ("wf.yaml", "wf_fakes.py", "problems.parquet", "initial.parquet")


def _mentor_run(folder: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(folder), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "mentor.workflows.cli", "run", "wf.yaml", "--run-dir", "run"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False)


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(f.relative_to(run_dir)): f.read_bytes() for f in sorted(run_dir.rglob("*")) if f.is_file()}


def _datasets(run_dir: Path) -> dict[str, bytes]:
    """Every data file (parquet outside the bookkeeping folders ``_done``, ``_shards``)."""
    return {k: v for k, v in _files(run_dir).items()
            if k.endswith(".parquet") and not any(p.startswith(("_", ".")) for p in Path(k).parts)}


def test_a_run_dir_written_before_the_layout_change_resumes(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(FIXTURE, old, ignore=shutil.ignore_patterns("__pycache__"))
    before = _files(old / "run")
    assert not (old / "run" / "round-001").exists() and "round-000/prompts/_done" in {str(Path(k).parent) for k in before}

    res = _mentor_run(old)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ran 5 stage(s), skipped 5 already done" in res.stderr + res.stdout
    after = _files(old / "run")
    changed = sorted(k for k, v in before.items() if after.get(k) != v)
    assert changed == [], f"round 0 of the old run was rewritten: {changed}"

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for name in INPUTS:
        shutil.copy(FIXTURE / name, fresh / name)
    res = _mentor_run(fresh)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ran 10 stage(s), skipped 0 already done" in res.stderr + res.stdout
    assert sorted(_files(fresh / "run")) == sorted(after)  # the same files, done markers (their keys) included
    resumed, new = _datasets(old / "run"), _datasets(fresh / "run")
    assert any(k.startswith("round-001/") for k in new) and resumed == new
