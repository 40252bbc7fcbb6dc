"""One module per stage: ingest, mine, hint, build, rollout, rescue, train; `stage(name)` looks one up.

Each module defines one `mentor.pipeline.stage.Stage` subclass and its instance,
``STAGE`` (also by its name: ``MINE``, ``HINT``, ...). Modules are imported on first
use, so asking for ``mine`` does not import the engine seam.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mentor.pipeline.stage import Stage

NAMES = ("ingest", "mine", "hint", "build", "rollout", "rescue", "train")
# A round of a workflow, in order: the trainer (train: `mentor.training`'s launchers), then four of the stages above.
ROUND_STAGES = ("train", "ingest", "mine", "hint", "build")


def stage(name: str) -> "Stage":
    """The stage called `name` (one of `NAMES`)."""
    if name not in NAMES:
        raise KeyError(f"no stage {name!r} (stages: {', '.join(NAMES)})")
    return importlib.import_module(f"mentor.stages.{name}").STAGE
