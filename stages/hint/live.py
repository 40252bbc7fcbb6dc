"""Live hints' hint call: the hint stage's machine on the groups that collapsed inside a training step.

The settings are the trainers' (`mentor.training.live_hints.LiveHintsConfig`); this module runs them
through the hint stage as offline (`hint_shard`: the four agents, rules, judge and fallback) and renders
the hinted prompt as `mentor build` renders that placement (`stages.build_render.prompt_messages`). The
trainers' hooks use it: `stages/hint/live_trl.py` (TRL's ``rollout_func``, and the TRL round process of a
round with live hints) and `stages/hint/live_openrlhf.py` (the agent executor OpenRLHF loads by path).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from mentor.pipeline.errors import config_error
from mentor.pipeline.llm import Backend
from mentor.stages.build_render import prompt_messages
from mentor.stages.hint.config import HintConfig
from mentor.stages.hint.machine import HintStats, hint_shard
from mentor.stages.solutions import load_solutions, with_solutions
from mentor.training.live_hints import LiveHintsConfig, system_text

log = logging.getLogger(__name__)


def hint_config(cfg: LiveHintsConfig, where: str = "live_hints") -> HintConfig:
    """The hint stage's settings for the live agents: the configured ones (``live_hints.hint``, checked by the hint
    stage's own model, its error naming `where` and the field), the judge check and vouching off.

    Checked where the agents run (the trainer's hook, before the first step) and by the train stage before a
    `mentor run` round launches; the trainers' round configs (`training/`) check only the shape of ``hint``."""
    try:
        return HintConfig.model_validate(cfg.hint | {"judge_check": {"enabled": False}, "vouch": None})
    except ValidationError as exc:
        raise config_error(exc, where, "hint") from None


def hinted_messages(cfg: LiveHintsConfig, problem: str, hint: str, domain: str, original: Any) -> list[dict[str, str]]:
    """The hinted prompt as `mentor build` writes it for the placement (its system message kept)."""
    system = cfg.system_prompt if cfg.system_prompt is not None else system_text(original)
    return prompt_messages([{"problem": problem, "hint": hint, "domain": domain}], cfg.placement, cfg.answer_template,
                           system_prompt=system, instructions=cfg.instructions)[0]


# --------------------------------------------------------------------------- the step's hint call


@dataclass
class StepHints:
    """What one step's hint engine did: the hints by group index, the counters, the seconds."""

    hints: dict[int, dict[str, Any]] = field(default_factory=dict)
    over_budget: int = 0
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)


def solutions_for(cfg: LiveHintsConfig) -> dict[str, str]:
    """The reference solutions the agents see, as offline (`see_solution`: the file's, else the bundled ones)."""
    hint_cfg = hint_config(cfg)
    return load_solutions(hint_cfg.solutions, "live_hints.hint.solutions") if hint_cfg.see_solution else {}


def hint_groups(rows: dict[int, dict[str, Any]], cfg: LiveHintsConfig, backend: Backend,
                solutions: dict[str, str] | None = None) -> StepHints:
    """Hint the collapsed rows (group index -> COLLAPSED row) within the step's budget, in batches of `cfg.batch`.

    `solutions` (`solutions_for`) fill each row's reference solution, as the hint stage does.
    Beyond `max_problems_per_step`, or once `max_seconds_per_step` have passed, the rest are not sent
    (``over_budget``). A batch the engine fails on entirely (`EngineError`) propagates: the step stops, as an
    offline hint shard would.
    """
    out = StepHints()
    order = sorted(rows)
    limit = cfg.max_problems_per_step if cfg.max_problems_per_step is not None else len(order)
    todo, out.over_budget = order[:limit], max(0, len(order) - limit)
    hint_cfg = hint_config(cfg)
    st = HintStats()
    started = time.perf_counter()
    while todo:
        if cfg.max_seconds_per_step is not None and time.perf_counter() - started >= cfg.max_seconds_per_step:
            out.over_budget += len(todo)
            break
        batch, todo = todo[: cfg.batch], todo[cfg.batch:]
        table = hint_shard(with_solutions([rows[i] for i in batch], solutions or {}), hint_cfg, backend, stats=st)
        for i, rec in zip(batch, table.to_pylist()):
            out.hints[i] = rec
    out.seconds = time.perf_counter() - started
    out.stats = st.as_dict()
    return out


__all__ = ["StepHints", "hint_config", "hint_groups", "hinted_messages", "solutions_for"]
