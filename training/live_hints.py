"""Live hints: a group that collapsed inside a training step is hinted and re-rolled in that same step.

Offline (the default) mentor hints what collapsed in a round's logs and the next round trains on the
hinted prompts. With ``live_hints`` in a round's trainer settings (TRL: `mentor.training.trl.live`),
each step's groups are generated and scored first; a group whose rewards are all 0 becomes one row
of the hint stage's COLLAPSED schema (its very rollouts are the failed responses Attribution reads)
and goes through the same four agents, rules, judge and fallback as offline (`hint_shard`, the hint
stage's own machine), on a hint engine of its own (a server: ``backend: openai``, e.g. `mentor serve`
or `vllm serve`); the group is then re-rolled from the hinted prompt, rendered as `mentor build`
renders that placement (`stages.build_render.prompt_messages`, `pipeline.prompts.render_prompt`).

This module is the trainer-independent part: the settings (`LiveHintsConfig`), the collapsed row of a
group (`collapsed_row`), the budgeted hint call (`hint_groups`) and the hinted prompt (`hinted_messages`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mentor.pipeline.llm import Backend, BackendSettings
from mentor.pipeline.prompts import INSTRUCTION_SEPARATOR, INSTRUCTIONS
from mentor.pipeline.schemas import parse_prompt_label
from mentor.stages.build_render import DEFAULT_PLACEMENT, PLACEMENTS, prompt_messages
from mentor.stages.hint.config import HintConfig
from mentor.stages.hint.machine import HintStats, hint_shard
from mentor.stages.solutions import load_solutions, with_solutions
from mentor.training.reward_core import count, target_from_label
from mentor.training.verify import verify

log = logging.getLogger(__name__)


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
        HintConfig.model_validate(v)  # the hint stage's own checks, with its error naming the field
        return v

    def hint_config(self) -> HintConfig:
        """The hint stage's settings for the live agents: the configured ones, the judge check and vouching off."""
        return HintConfig.model_validate(self.hint | {"judge_check": {"enabled": False}, "vouch": None})


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
    hint_cfg = cfg.hint_config()
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
    hint_cfg = cfg.hint_config()
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


__all__ = ["LiveHintsConfig", "StepHints", "collapsed_row", "hint_groups", "hinted_messages", "problem_text", "solutions_for", "system_text",
           "user_text"]
