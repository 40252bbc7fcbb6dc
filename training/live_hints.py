"""Live hints' settings: a group that collapsed inside a training step is hinted and re-rolled in that same step.

Offline (the default) mentor hints what collapsed in a round's logs and the next round trains on the
hinted prompts. With ``live_hints`` in a round's trainer settings (TRL, OpenRLHF), each step's groups
are generated and scored first; a group whose rewards are all 0 becomes one row of the hint stage's
COLLAPSED schema (its very rollouts are the failed responses Attribution reads) and goes through the
same four agents, rules, judge and fallback as offline, on a hint engine of its own (a server:
``backend: openai``, e.g. `mentor serve` or `vllm serve`); the group is then re-rolled from the hinted
prompt, rendered as `mentor build` renders that placement.

This module is what a trainer's settings, scoring and live hook need and no stage code: the settings
(`LiveHintsConfig`, a field of the round configs of the trainers with live hints), the score (`live_score`), a
group's collapsed row (`collapsed_row`, `problem_text`), and the shape of the hint call a hook is handed
(`Hinter`, `StepHints`). What runs the hint agents is the hint stage's: its live entry (`LIVE_ENTRY`,
`mentor.stages.hint.live`) is what a trainer's launcher starts, by name (a process module, or a file the
trainer loads by path), never imports; the entry imports the trainer's live hook (the module its launcher
declares as ``live``, in the trainer's own folder) and hands it the hint call (`Hinter`): the hook's `main`
(a process) or a name the trainer takes from the entry's file (the hook's ``FILE_EXPORTS``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mentor.pipeline.llm import BackendSettings
from mentor.pipeline.prompts import DEFAULT_PLACEMENT, INSTRUCTION_SEPARATOR, INSTRUCTIONS, PLACEMENTS
from mentor.pipeline.schemas import parse_prompt_label
from mentor.training.reward_core import count, target_from_label
from mentor.training.verify import verify

log = logging.getLogger(__name__)

# The live-hints entry a trainer's launcher starts by name (stage code, above this room: never imported here):
# ``python -m LIVE_ENTRY KIND ARGS...`` runs trainer KIND's live hook's `main`; a trainer that loads a file by
# path is given `live_entry_file()`, with `ENV_TRAINER` naming the trainer whose hook's names it takes from it.
LIVE_ENTRY = "mentor.stages.hint.live"
ENV_TRAINER = "MENTOR_LIVE_TRAINER"


def live_entry_file() -> Path:
    """The file of `LIVE_ENTRY` (the tree is the import path: mentor's rooms are the folders beside this one's)."""
    return Path(__file__).resolve().parents[1].joinpath(*LIVE_ENTRY.split(".")[1:]).with_suffix(".py")


class LiveHintsConfig(BaseModel):
    """``trainer: {kind: trl, live_hints: {...}}``: hint and re-roll collapsed groups inside the training step."""

    model_config = ConfigDict(extra="forbid")

    backend: BackendSettings = Field(description="The hint engine, as a hint stage's backend: a server "
                                     "({backend: openai, base_url: http://HOST:PORT/v1, model: NAME}: `mentor serve`, `vllm serve`).")
    max_problems_per_step: int | None = Field(8, ge=1, description="Collapsed groups hinted per step at most; the rest go on "
                                              "unhinted (counted as over_budget). None: no limit.")
    max_seconds_per_step: float | None = Field(None, gt=0, description="Seconds of hint engine per step: no new batch of "
                                               "problems starts after this (a batch that started finishes). None: no limit.")
    batch: int = Field(8, ge=1, description="Collapsed groups sent to the hint engine together (one hint_shard call).")
    placement: Literal[PLACEMENTS] = Field(  # type: ignore[valid-type]
        DEFAULT_PLACEMENT, description="Where the hint goes in the re-rolled prompt, as `mentor build --placement`.")
    answer_template: str | None = Field(None, description="How the hint opens the answer (placement assistant), as build's.")
    system_prompt: str | None = Field(None, description="The system message build adds (build's system_prompt); by default "
                                      "the prompt's own system message is kept.")
    instructions: dict[str, str] = Field(default_factory=lambda: dict(INSTRUCTIONS),
                                         description="Per-domain instruction, as build's (stripped to find the problem text).")
    hint: dict[str, Any] = Field(default_factory=dict, description="Hint stage settings (HintConfig fields, e.g. "
                                 "{max_refine: 1, llm_judge: false}); vouch and the judge check are off live.")
    hint_prompts_with_hints: bool = Field(False, description="Also hint a collapsed group whose prompt already carries an "
                                          "offline hint (its label's hint_id); by default such groups keep their rollouts.")

    @field_validator("backend")
    @classmethod
    def _backend_checked(cls, v: BackendSettings) -> BackendSettings:
        v.check("live_hints.backend")
        return v

    @field_validator("hint")
    @classmethod
    def _hint_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in ("vouch", "judge_check"):
            if v.get(key) not in (None, {}):
                raise ValueError(f"hint.{key} is not run live (it re-rolls or calibrates before a run); leave it out")
        return v  # the hint stage's own checks: `mentor.stages.hint.live.hint_config`, where the agents run


@dataclass
class StepHints:
    """What one step's hint engine did: the hints by group index, the counters, the seconds."""

    hints: dict[int, dict[str, Any]] = field(default_factory=dict)
    over_budget: int = 0
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)


class Hinter(Protocol):
    """The hint call a trainer's live hook is handed (the hint stage's `mentor.stages.hint.live.LiveHinter`), built
    once per process from the round's `LiveHintsConfig` (a `HinterFactory`): its reference solutions read then."""

    def hint(self, rows: dict[int, dict[str, Any]], backend: Any) -> StepHints:
        """Hint the collapsed rows (group index -> COLLAPSED row) on the hint engine `backend`, within the step's budget."""

    def messages(self, problem: str, hint: str, domain: str, original: Any) -> list[dict[str, str]]:
        """The hinted prompt's messages as `mentor build` renders the placement (`original`: the prompt it replaces)."""


HinterFactory = Callable[[LiveHintsConfig], Hinter]


def live_score(label: Any, prompt: str, response: str) -> float:
    """The response's correctness (1.0 or 0.0) against the reference its label names, counted as the offline
    reward counts (``scored``, ``correct``, ``verify_error``)."""
    target = target_from_label(label, prompt)
    try:
        correct = float(verify(target.domain, response, target.reference)) if target.reference is not None else 0.0
    except Exception:  # verify() guards itself; the last line of defence, as the offline reward
        log.exception("live hints: verification failed for %s", target.problem_id)
        count("verify_error")
        correct = 0.0
    count("scored")
    count("correct", int(correct > 0))
    return correct


def live_text(live: LiveHintsConfig | None, head: str = "", tail: str = "") -> str:
    """One line for a dry run: off, or the hint engine, placement and per-step budget (`head`, `tail` around them)."""
    if live is None:
        return "off (offline hints only)"
    b = live.backend
    return (f"on: {head}hint engine {b.backend} {b.model or 'embedded'}{' at ' + b.base_url if b.base_url else ''}, "
            f"placement {live.placement}, at most {live.max_problems_per_step or 'every'} group(s) and "
            f"{live.max_seconds_per_step or 'unlimited'} s per step{tail}")


def with_hint_id(label: str | None, hint_id: str) -> str | None:
    """The row's label with the live hint's id, so the re-rolls are logged (and mined) as hinted rollouts."""
    try:
        obj = parse_prompt_label(label)
    except (TypeError, ValueError):  # None, or not a mentor prompt label: kept as it is
        return label
    return json.dumps(obj | {"hint_id": hint_id}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------- a group as a collapsed problem


def user_text(messages: Any) -> str | None:
    """The last user message's text of a chat prompt; None for a text prompt."""
    if not isinstance(messages, (list, tuple)):
        return None
    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users and isinstance(users[-1], str) else None


def system_text(messages: Any) -> str | None:
    if not isinstance(messages, (list, tuple)):
        return None
    found = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "system"]
    return found[0] if found and isinstance(found[0], str) else None


def problem_text(messages: Any, domain: str, instructions: dict[str, str]) -> str | None:
    """The problem of an unhinted chat prompt: its user message without build's domain instruction."""
    text = user_text(messages)
    if text is None:
        return None
    tail = instructions.get(domain) or ""
    if tail and text.endswith(INSTRUCTION_SEPARATOR + tail):
        return text[: -len(INSTRUCTION_SEPARATOR + tail)]
    return text


def collapsed_row(problem_id: str, round_: int, domain: str, problem: str, reference: str | None,
                  responses: list[str]) -> dict[str, Any]:
    """A group whose rewards are all 0 as one COLLAPSED row: its responses are what Attribution reads."""
    return {"problem_id": problem_id, "round": int(round_), "domain": domain, "problem": problem, "label": reference,
            "n_rollouts": len(responses), "failed": list(responses), "streak": 1, "previous_hints": [], "solution": None}


__all__ = ["ENV_TRAINER", "Hinter", "HinterFactory", "LIVE_ENTRY", "LiveHintsConfig", "StepHints", "collapsed_row",
           "live_entry_file", "live_score", "live_text", "problem_text", "system_text", "user_text", "with_hint_id"]
