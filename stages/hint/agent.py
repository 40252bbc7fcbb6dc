"""An agent of the hint stage: the `Agent` base class, what an agent file declares, and the helpers agents share.

An agent is one file of ``stages/hint/agents/`` (or ``<plugin folder>/agents/`` on
``MENTOR_PLUGIN_PATH``) that declares ``AGENT = <its Agent instance>``; its prompt
templates are ``<template>.txt`` files beside it. Everything the stage needs of an
agent comes from that declaration (`mentor.stages.hint.agents` collects them):

    name              request ids ("i:name:n"), seeds, stats, trace, its `Phase`, ``max_tokens.<name>``,
                      its key in ``agent_chat_template_kwargs``
    role              where it goes in the state machine (below)
    switch            the `HintConfig` on/off setting that runs it (None: always on)
    templates         its template files -> the placeholders each may use
    max_tokens_default, max_tokens_help, creative (sampling)
    state             fields it adds to a problem's state (machine.py's `ProblemState`), with their defaults
    violations        the violations its answers can set (their repair messages: `describe`)
    counters          its own counters in stats.json
    fake              what the ``--backend fake`` model answers it (tests and demos)
    messages, schema, fields (parse), consume: the request, its JSON schema, how the answer is read, what it does

Roles (a problem's path; agents of one role run in name order, built-ins first):

    analysis    before the first candidate: each enabled one in turn, then the ``generate`` agent
                (attribution). `consume` stores what it found in the state, then ``m.transition(p, "analysed")``.
    generate    writes a candidate hint (generation); one agent. Its answer goes through the rules.
    review      after the rules pass: each enabled one in turn must approve (judgment);
                `consume` calls ``m.transition(p, "approved")`` or ``"rejected"`` with violations.
    repair      rewrites a rejected candidate (repair); one agent. Its answer goes through the rules.

The agents are collected when `mentor.stages.hint.agents` is first imported (the settings
and the state machine are built from them then): set ``MENTOR_PLUGIN_PATH`` before, as the
``mentor`` command and its dask workers do. `tests/test_extension_agent_rule.py` has a
plugin agent of one file (role analysis, no templates: its messages are written inline).

A parse never raises: anything that is not the requested JSON gives None,
and the caller keeps the raw text.
"""

from __future__ import annotations

import json
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from mentor.stages.rules import RuleLimits
from mentor.stages.solutions import solution_text

if TYPE_CHECKING:  # (config.py builds its per-agent settings from the agents: the import runs the other way)
    from mentor.pipeline.llm import GenResult
    from mentor.stages.hint.config import HintConfig
    from mentor.stages.hint.prompt_templates import Templates

Role = Literal["analysis", "generate", "review", "repair"]
ROLES: tuple[str, ...] = ("analysis", "generate", "review", "repair")


@dataclass(frozen=True)
class Switch:
    """An agent's on/off setting: a boolean field of `HintConfig` (its YAML key, default and description)."""

    key: str
    description: str
    default: bool = True


# --------------------------------------------------------------------------- helpers


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def strip_thinking(text: str) -> str:
    """`text` without a reasoning model's thinking (``<think>…</think>``), so JSON is never read out of it.

    Qwen3 and the R1 family think before they answer; a reasoning parser or a
    backend without a JSON grammar passes the block through. Everything up to the
    last ``</think>`` is thinking (R1-style templates open the block in the
    prompt, so the output may hold only the closing tag); an unclosed
    ``<think>`` (the model ran out of tokens while thinking) leaves no answer.
    """
    if not text:
        return text
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        return text[close + len(_THINK_CLOSE):].lstrip()
    start = text.find(_THINK_OPEN)
    return text[:start].rstrip() if start >= 0 else text


def json_object(text: str) -> dict | None:
    """The JSON object in `text` (also when wrapped in prose or a code fence, or after a thinking block), else None."""
    text = strip_thinking(text)
    if not text:
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        i, j = text.find("{"), text.rfind("}")
        if i < 0 or j <= i:
            return None
        try:
            obj = json.loads(text[i : j + 1])
        except ValueError:
            return None
    return obj if isinstance(obj, dict) else None


def reference_text(row: dict, max_chars: int = 1500) -> str:
    """The reference as the attribution and judgment agents see it."""
    label = row.get("label") or ""
    if row.get("domain") != "code":
        return label or "(unknown)"
    try:
        obj = json.loads(label)
    except ValueError:
        return label[:max_chars]
    tests = (obj.get("tests") or "").strip()
    if len(tests) > max_chars:
        tests = tests[:max_chars] + "\n[...]"
    return f"entry point `{obj.get('entry_point')}`; tests:\n{tests}"


def solution_in_view(row: dict, cfg: HintConfig) -> str:
    """The reference solution the agents see ("" when there is none, or ``see_solution`` is off)."""
    return solution_text(row, cfg.solution_chars) if cfg.see_solution else ""


def format_failed(failed: list[str] | None, max_failed: int, max_chars: int) -> str:
    if not failed:
        return "(none recorded)"
    parts = []
    for i, text in enumerate(failed[:max_failed], 1):
        text = text if len(text) <= max_chars else text[: max_chars // 5] + " [...] " + text[-(max_chars - max_chars // 5) :]
        if "</attempt" in text:  # the delimiters are ours: a response cannot close them early
            text = text.replace("</attempt", "</ attempt")
        parts.append(f"<attempt {i}>\n{text}\n</attempt {i}>")
    return "\n".join(parts)


def clean_str(v: Any, max_chars: int) -> str | None:
    if not isinstance(v, str):
        return None
    v = " ".join(v.split())
    return v[:max_chars] if v else None


# --------------------------------------------------------------------------- the agents


class State(Protocol):
    """What the agents read of a problem on its way through the stage (machine.py's `ProblemState`;
    an agent's own `state` fields are there too)."""

    row: dict  # the collapsed row
    retry: int  # regenerations used
    rejected: list[str]  # why the last regenerated candidate was rejected
    candidate: str | None  # the hint under review or repair
    last_violations: list[str]  # why the candidate was rejected
    feedback: str | None  # the reviewer's, on the candidate
    cand_no: int  # candidates produced so far (generation + repair)


class Machine(Protocol):
    """What an agent's `consume` may use of the state machine (machine.py's `HintMachine`)."""

    cfg: HintConfig
    t: Templates
    st: Any  # the shard's `Stats` (an agent's `counters` among them)
    memo: dict[str, Any]  # per shard, for an agent's own use (keyed by its name)

    def transition(self, p: Any, event: str, violations: Any = (), feedback: str | None = None) -> None: ...

    def candidate(self, p: Any, res: GenResult, parsed: dict | None) -> None: ...


class Agent(ABC):
    """One agent, declared once: how its request is built, how its answer is read and what it does.

    As distilabel's Task: `messages` builds the chat from a problem's state (format_input),
    `schema` is the JSON its answer must follow (get_structured_output), `parse` reads the
    raw text back into fields, or None when it is not the requested JSON (format_output;
    the stage keeps the raw text in the trace either way). The state machine calls these for
    every agent alike, then `consume`, which moves the problem on (``m.transition``).
    Everything else about it is the declarations below (the module docstring lists them).
    """

    name: ClassVar[str]  # the request ids ("i:name:n"), seeds, stats, trace, max_tokens.<name>
    role: ClassVar[Role]  # where it goes in the state machine
    switch: ClassVar[Switch | None] = None  # its on/off setting in HintConfig (None: always on)
    creative: ClassVar[bool] = False  # sampled at temperature/top_p, else at analysis_temperature (greedy by default)
    templates: ClassVar[dict[str, frozenset[str]]] = {}  # its template files (``<name>_system``, ...) -> their placeholders
    max_tokens_default: ClassVar[int]  # the default of ``max_tokens.<name>``
    max_tokens_help: ClassVar[str]  # its description in the settings
    state: ClassVar[dict[str, Callable[[], Any]]] = {}  # fields it adds to ProblemState -> their default factory
    violations: ClassVar[dict[str, str]] = {}  # violations it sets itself -> what the repair agent is told
    counters: ClassVar[tuple[str, ...]] = ()  # its own counters in the stage's stats (``m.st.<name> += 1``)
    fake: ClassVar[str]  # the fake backend's answer to it (JSON whose keys its schema has)

    @property
    def folder(self) -> Path:
        """Where its template files are: beside its module."""
        return Path(sys.modules[type(self).__module__].__file__ or ".").parent

    def enabled(self, cfg: HintConfig) -> bool:
        return self.switch is None or bool(getattr(cfg, self.switch.key))

    def attempt(self, s: State) -> int:
        """The n of the request id ``i:name:n`` and of its seed."""
        return s.cand_no

    def sampling(self, cfg: HintConfig) -> tuple[float, float]:
        """temperature, top_p."""
        return (cfg.temperature, cfg.top_p) if self.creative else (cfg.analysis_temperature, 1.0)

    def max_tokens(self, cfg: HintConfig) -> int:
        return getattr(cfg.max_tokens, self.name)

    @abstractmethod
    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]: ...

    @abstractmethod
    def schema(self, cfg: HintConfig, limits: RuleLimits) -> dict:
        """The answer's JSON schema for a problem of a domain with these hint limits."""

    def parse(self, text: str, cfg: HintConfig) -> dict | None:
        """The answer's fields, or None (no JSON object in `text`, or not the fields asked for)."""
        obj = json_object(text)
        return None if obj is None else self.fields(obj, cfg)

    @abstractmethod
    def fields(self, obj: dict, cfg: HintConfig) -> dict | None:
        """The answer's fields read from its JSON object, or None when they are not usable."""

    def consume(self, p: Any, res: GenResult, parsed: dict | None, m: Machine) -> None:
        """What its answer does (`parsed`: None when it did not parse); it ends with one ``m.transition``.

        The default, by role: an analysis agent moves on; a generate or repair agent's hint goes
        through the rules (``m.candidate``); a review agent must override it."""
        if self.role == "analysis":
            m.transition(p, "analysed")
        elif self.role in ("generate", "repair"):
            m.candidate(p, res, parsed)
        else:
            raise NotImplementedError(f"agent {self.name!r} (role review) must define consume")

    def chat(self, t: Templates, user: str) -> list[dict]:
        """The system message (its ``<name>_system`` template) and the user message."""
        return [{"role": "system", "content": t.texts[f"{self.name}_system"]}, {"role": "user", "content": user}]


def text_field(max_chars: int) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": max_chars}


def object_schema(props: dict) -> dict:
    """A JSON object of exactly `props`, all required, in this order (the order the grammar writes them)."""
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


