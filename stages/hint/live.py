"""Live hints' hint call and entry: the hint stage's machine on the groups that collapsed inside a training step.

The settings are the trainers' (`mentor.training.live_hints.LiveHintsConfig`); this module runs them
through the hint stage as offline (`hint_shard`: the four agents, rules, judge and fallback) and renders
the hinted prompt as `mentor build` renders that placement (`stages.build_render.prompt_messages`):
`LiveHinter`, the hint call (`mentor.training.live_hints.Hinter`).

It is also the one live-hints entry a trainer's launcher starts by name (`LIVE_ENTRY`; training/ never
imports the stages). It knows no trainer: the trainer's live hook is the module its launcher declares
as ``live`` (in the trainer's own folder), and the entry hands it the hint call:

- as a process, ``python -m mentor.stages.hint.live KIND ARGS...``: the hook's ``main(ARGS, LiveHinter)``;
- as a file a trainer loads by path and takes a name from: with ``MENTOR_LIVE_TRAINER=KIND`` set (the
  launcher sets it), each name of the hook's ``FILE_EXPORTS`` (name -> a function of the hint call's
  factory) is found here (the module's ``__getattr__``).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from mentor.pipeline.errors import ConfigError, config_error
from mentor.pipeline.llm import Backend
from mentor.stages.build_render import prompt_messages
from mentor.stages.hint.config import HintConfig
from mentor.stages.hint.machine import HintStats, hint_shard
from mentor.stages.solutions import load_solutions, with_solutions
from mentor.training.launcher import get_launcher, trainer_kinds
from mentor.training.live_hints import ENV_TRAINER, LIVE_ENTRY, LiveHintsConfig, StepHints, system_text

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


class LiveHinter:
    """The hint call a trainer's live hook is handed (`mentor.training.live_hints.Hinter`): the round's settings,
    their reference solutions read once (a missing file fails the start, not a step).

    (A plain class: a trainer may execute this file as a module it does not register, where `dataclasses`
    cannot resolve postponed annotations.)"""

    def __init__(self, cfg: LiveHintsConfig) -> None:
        self.cfg = cfg
        self.solutions = solutions_for(cfg)

    def hint(self, rows: dict[int, dict[str, Any]], backend: Backend) -> StepHints:
        return hint_groups(rows, self.cfg, backend, self.solutions)

    def messages(self, problem: str, hint: str, domain: str, original: Any) -> list[dict[str, str]]:
        return hinted_messages(self.cfg, problem, hint, domain, original)


# --------------------------------------------------------------------------- the entry


def live_hook(kind: str) -> ModuleType:
    """Trainer `kind`'s live hook: the module its launcher declares as ``live``; a `ConfigError` when it has none."""
    hook = get_launcher(kind).live
    if not hook:
        with_live = [k for k in trainer_kinds() if get_launcher(k).live]
        raise ConfigError(f"trainer kind {kind}: it has no live hints (its launcher declares no live hook); "
                          f"live hints run in {', '.join(with_live) or 'no trainer'}")
    return importlib.import_module(hook)


def main(argv: list[str]) -> int:
    """``python -m mentor.stages.hint.live KIND ARGS...``: trainer KIND's live hook's process, with the hint call."""
    if not argv or argv[0].startswith("-"):
        print(f"usage: python -m {LIVE_ENTRY} KIND ARGS... (KIND: a trainer with live hints; its launcher starts this)",
              file=sys.stderr)
        return 2
    try:
        hook = live_hook(argv[0])
    except ConfigError as exc:
        print(f"{LIVE_ENTRY}: {exc}", file=sys.stderr)
        return 2
    return hook.main(argv[1:], LiveHinter)


_FILE_EXPORTS: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """A name a trainer takes from this file when it loads it by path (``MENTOR_LIVE_TRAINER`` names the trainer):
    its live hook's ``FILE_EXPORTS[name]``, given the hint call's factory; built once."""
    kind = os.environ.get(ENV_TRAINER)
    if name.startswith("__") or not kind:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}"
                             + ("" if name.startswith("__") else f" ({ENV_TRAINER} is not set: a trainer that loads "
                                f"{__file__} by path takes its live hook's names from it; `mentor train` sets it)"))
    if name not in _FILE_EXPORTS:
        exports = getattr(live_hook(kind), "FILE_EXPORTS", {})
        if name not in exports:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r} (trainer {kind}'s live hook exports "
                                 f"{', '.join(exports) or 'nothing'} from this file)")
        _FILE_EXPORTS[name] = exports[name](LiveHinter)
    return _FILE_EXPORTS[name]


__all__ = ["LiveHinter", "StepHints", "hint_config", "hint_groups", "hinted_messages", "live_hook", "main", "solutions_for"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
