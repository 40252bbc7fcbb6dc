"""The settings a workflow runner decides per round, shared by the TRL and verl launchers."""

from __future__ import annotations

import os
from typing import Any


def round_updates(cfg: Any, round_: int | None = None, prompts: str | os.PathLike | None = None,
                  round_dir: str | os.PathLike | None = None, train_dir: str | os.PathLike | None = None,
                  rollout_dir: str | os.PathLike | None = None, prev_model: str | None = None) -> dict[str, Any]:
    """The fields of a round config (`round`, paths, `actor_model`) this round sets; `prev_model` only where none is given."""
    upd: dict[str, Any] = {}
    for key, value in (("round", round_), ("prompts", prompts), ("round_dir", round_dir), ("train_dir", train_dir),
                       ("rollout_log_dir", rollout_dir)):
        if value is not None:
            upd[key] = value if key == "round" else str(value)
    if prev_model and not cfg.actor_model:
        upd["actor_model"] = prev_model
    return upd
