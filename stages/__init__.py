"""One module per stage: ingest, mine, hint, build, rollout, rescue; `stage(name)` looks one up.

Each module defines ``STAGE``, a `mentor.pipeline.stage.StageSpec` (the `Stage`
shape: ``Inputs``, ``Config``, ``run``). Modules are imported on first use, so
asking for ``mine`` does not import the engine seam.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mentor.pipeline.stage import Stage

NAMES = ("ingest", "mine", "hint", "build", "rollout", "rescue")


def stage(name: str) -> "Stage":
    """The stage called `name` (one of `NAMES`)."""
    if name not in NAMES:
        raise KeyError(f"no stage {name!r} (stages: {', '.join(NAMES)})")
    return importlib.import_module(f"mentor.stages.{name}").STAGE
