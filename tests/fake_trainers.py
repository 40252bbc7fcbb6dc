"""Stand-ins for a trainer's interpreter (``python`` of a round config), for tests of the launchers.

A launcher runs the trainer's Python before the trainer: ``python -c CODE REWARD ATTRIBUTE`` to load the
reward function as the trainer will (`mentor.training.reward_check`) and ``python -m
mentor.training.ray_preflight`` to join the Ray cluster as the trainer will; then the trainer itself. The
stand-in passes the checks to this interpreter, for real, and runs `body` for the trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path


def fake_trainer(path: Path, body: str) -> str:
    """Write an executable at `path` whose trainer run is `body` (Python; ``sys.argv`` is the trainer's argv)."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "if sys.argv[1:2] == ['-c'] or sys.argv[1:3] == ['-m', 'mentor.training.ray_preflight']:"
        "  # the launcher's reward and Ray checks: the real interpreter answers\n"
        f"    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
        + body
    )
    path.chmod(0o755)
    return str(path)
