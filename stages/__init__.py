"""The stages: each module of this folder (or of a plugin folder's ``stages/``) that declares ``STAGE`` is one.

A stage module defines one `mentor.pipeline.stage.Stage` subclass and its instance,
``STAGE`` (also by its name: ``MINE``, ``HINT``, ...); the other modules here
(``build_base``, ``ingest_formats``, ``solutions``, ...) are a stage's parts. The
lists are read from the declarations (`mentor.pipeline.plugins`), never written by
hand: `names()` finds the stage modules by their top-level ``STAGE =`` without
importing any (asking for ``mine`` does not import the engine seam), and
`round_stages()` is the stages that declare a place in a workflow round
(``Stage.round_order``), in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mentor.pipeline import plugins

if TYPE_CHECKING:
    from mentor.pipeline.stage import Stage


def names() -> tuple[str, ...]:
    """The stages by name: the built-in ones, then plugins (`mentor.pipeline.plugins`)."""
    return tuple(name for name in plugins.names("stages") if plugins.declared("stages", name, "STAGE") is not None)


def stage(name: str) -> "Stage":
    """The stage called `name` (one of `names()`)."""
    known = names()
    if name not in known:
        raise KeyError(f"no stage {name!r} (stages: {', '.join(known)})")
    return plugins.load("stages", name).STAGE


def round_stages() -> tuple["Stage", ...]:
    """The stages of a workflow round, in order (built-in: train -> ingest -> mine -> hint -> build)."""
    found = [stage(n) for n in names()]
    return tuple(sorted((s for s in found if s.round_order is not None), key=lambda s: (s.round_order, s.name)))


def round_names() -> tuple[str, ...]:
    return tuple(s.name for s in round_stages())


def stage_dirs() -> dict[str, str]:
    """Round stage -> its folder in a run's ``round-NNN/`` (``Stage.round_dir``: the dataset it produces)."""
    return {st.name: st.round_dir for st in round_stages()}
