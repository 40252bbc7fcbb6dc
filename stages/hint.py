"""Hint: turn collapsed problems into answer-free hints with four LLM agents.

Waves. Every pending problem of a shard takes its next agent step in the same
wave, and a wave is ONE backend call (requests of different agents mixed), so
engine calls grow with the number of waves, never with the number of
problems. A problem's path through the waves:

    attribution -> generation -> rules [-> judgment] -> accepted
                                   | fail                 | low score
                                   v                      v
                       repair (up to max_refine) -> rules [-> judgment] -> ...
                                   | still failing
                                   v
                       regenerate (up to max_retry) ... -> safe fallback

The phases are `Phase`; each agent is one declared `Agent` record (token
limit, sampling, schema, message builder), so a request is built in one line;
every phase change happens in `_Shard.transition`, whose table is the state
machine above. Rules run locally between waves (no engine call); only a hint
that passes them is sent to the LLM judge. Bad model output (invalid JSON, empty text,
truncation, a hint in another language, keywords that are the answer, a
failed trajectory that carries instructions) only ever moves a problem along
this path, and is counted in the stats.

Shards. `hint_shard(rows, cfg, backend)` is a pure function of its rows (the
seeds of every request derive from problem ids, not positions); `hint_to_dir`
splits the collapsed set into shards, runs them with the stage's executor
(`mentor.pipeline.executor`: in-process, or dask workers that each own one
engine built from a picklable `BackendSpec`), writes each shard atomically
with a done marker keyed by the shard's input hash and the config hash, and
concatenates them into ``hints.parquet`` + ``stats.json``. A killed run
resumes without redoing finished shards; a re-run of the same inputs and
config makes no engine call (and starts no engine).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from mentor.pipeline.errors import ConfigError, EngineError
from mentor.pipeline.executor import Executor, LocalExecutor
from mentor.pipeline.ids import content_hash
from mentor.pipeline.llm import Backend, GenRequest, GenResult, engine_starts, release_engines
from mentor.pipeline.schemas import HINTS, SCHEMA_VERSION, TRACE_ENTRY, schema_metadata
from mentor.pipeline.stage import Stats, StatsLayout, read_done, write_done, write_stats
from mentor.stages import hint_agents as agents
from mentor.stages.hint_rules import Instructions, RuleContext, RuleLimits, check_hint, copies_instructions, trim_to_rules
from mentor.stages.judge_check import JudgeCheckConfig
from mentor.stages.vouch import VouchConfig

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- config


# Qwen3's switch; templates that have no such variable ignore it.
THINKING_OFF = {"enable_thinking": False}


class DomainOverrides(BaseModel):
    """Per-domain settings that replace the global ones when set."""

    model_config = ConfigDict(extra="forbid")

    max_retry: int | None = Field(None, ge=0, description="Regenerations from the keywords after the refines are spent.")
    max_refine: int | None = Field(None, ge=0, description="Repair rounds per generated hint.")
    judge_threshold: float | None = Field(None, ge=1, le=10, description="Minimum judge score (1-10) to accept.")
    max_hint_chars: int | None = Field(None, ge=40, description="Longest acceptable hint, characters.")
    max_hint_sentences: int | None = Field(None, ge=1, description="Most sentences in a hint.")


class TokenLimits(BaseModel):
    """max_tokens per agent call (JSON output is also bounded by its schema)."""

    model_config = ConfigDict(extra="forbid")

    attribution: int = Field(200, ge=16, description="max_tokens of an attribution call.")
    generation: int = Field(360, ge=16, description="max_tokens of a generation call (reasoning + hint).")
    judgment: int = Field(120, ge=16, description="max_tokens of a judgment call.")
    repair: int = Field(360, ge=16, description="max_tokens of a repair call (reasoning + hint).")


class HintConfig(BaseModel):
    """Settings of `mentor hint` (also the `hint:` section of a workflow)."""

    model_config = ConfigDict(extra="forbid")

    max_retry: int = Field(2, ge=0, description="Regenerations from the keywords after the refines are spent (the method's Max Retry).")
    max_refine: int = Field(2, ge=0, description="Repair rounds per generated hint (the method's Max Refine).")
    judge_threshold: float = Field(7.0, ge=1, le=10, description="A hint that passes the rules is accepted when the judge's score (1-10) reaches this.")
    llm_judge: bool = Field(True, description="Ask the LLM judge after the rules pass (off: the rules alone decide).")
    judge_correctness: bool = Field(True, description="The judge first states whether every statement and calculation of the hint "
                                    "is correct; a hint judged incorrect is rejected whatever its score.")
    trim_hints: bool = Field(True, description="A hint rejected only for what follows its first sentences (too long, the answer, "
                             "the worked solution) is cut back to its longest leading run of whole sentences that passes the rules, "
                             "and goes on to the judge; off: such a hint goes to repair.")
    reasoning_chars: int = Field(600, ge=0, description="Room for the generation and repair agents to work the problem out "
                                 "(towards the reference answer) before they write the hint; kept in the trace, never in the hint. 0: off.")
    attribution: bool = Field(True, description="Run the Attribution agent (off: the hint is generated from the problem alone, "
                              "the method's 'without Attribution' ablation).")
    generation: bool = Field(True, description="Run the Generation agent (off: the hint is the keyword template filled with the "
                             "attribution's keywords, the 'without Generation' ablation; with attribution off too, the generic default hint).")
    domains: dict[Literal["math", "code"], DomainOverrides] = Field(default_factory=dict, description="Per-domain overrides, e.g. {code: {max_refine: 3}}.")
    max_tokens: TokenLimits = Field(default_factory=TokenLimits, description="max_tokens per agent.")
    temperature: float = Field(0.7, ge=0, le=2, description="Sampling temperature of generation and repair.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling of generation and repair.")
    analysis_temperature: float = Field(0.0, ge=0, le=2, description="Temperature of attribution and judgment.")
    seed: int = Field(0, description="Base seed; each request's seed derives from it, the problem id, the agent and the attempt.")
    max_hint_chars: int = Field(RuleLimits.max_chars, ge=40, description="Longest acceptable hint, characters (also the JSON schema's maxLength).")
    max_hint_sentences: int = Field(RuleLimits.max_sentences, ge=1, description="Most sentences in a hint.")
    max_keywords: int = Field(5, ge=1, le=20, description="Keywords the attribution agent may return.")
    keyword_chars: int = Field(40, ge=4, description="Longest keyword, characters.")
    error_chars: int = Field(240, ge=16, description="Longest attributed error, characters.")
    feedback_chars: int = Field(240, ge=16, description="Longest judge feedback, characters.")
    max_failed: int = Field(2, ge=0, description="Failed responses shown to the attribution agent.")
    failed_chars: int = Field(1500, ge=64, description="Characters kept per failed response in the prompt (mostly its end).")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=lambda: dict(THINKING_OFF),
        description="Variables for the hint model's chat template, for every agent. The default turns a thinking model's "
        "thinking off (Qwen3's enable_thinking); a template that does not use a variable ignores it. {}: the template's defaults.")
    agent_chat_template_kwargs: dict[Literal["attribution", "generation", "judgment", "repair"], dict[str, Any]] = Field(
        default_factory=dict, description="Per-agent additions to chat_template_kwargs, e.g. {judgment: {enable_thinking: true}} "
        "lets the judge think (its <think> block is dropped before the verdict is read).")
    templates_dir: str | None = Field(None, description="Directory whose <name>.txt files replace the bundled prompt templates.")
    shard_size: int = Field(512, ge=1, description="Problems per shard (one shard = one batch of waves; dask runs shards in parallel).")
    judge_check: JudgeCheckConfig = Field(default_factory=JudgeCheckConfig, description="Score the LLM judge on known-good "
                                          "and known-bad hints before the run trusts it (stages/judge_check.py).")
    vouch: VouchConfig | None = Field(None, description="Keep a hint only when the policy, re-rolled with it, earns reward; "
                                      "else try the next candidate (stages/vouch.py). None: off.")

    def for_domain(self, domain: str) -> tuple[int, int, float, RuleLimits]:
        o = self.domains.get(domain)  # type: ignore[call-overload]
        pick = lambda name: getattr(o, name) if o is not None and getattr(o, name) is not None else getattr(self, name)  # noqa: E731
        limits = RuleLimits(max_chars=pick("max_hint_chars"), max_sentences=pick("max_hint_sentences"))
        return pick("max_retry"), pick("max_refine"), pick("judge_threshold"), limits

    def template_kwargs(self, agent: str) -> dict[str, Any] | None:
        """The chat-template variables of `agent`'s requests (None: none)."""
        kw = {**self.chat_template_kwargs, **self.agent_chat_template_kwargs.get(agent, {})}  # type: ignore[call-overload]
        return kw or None

    def semantic(self) -> dict[str, Any]:
        """The settings that change outputs (not how the work is split or where templates live).

        The chat-template variables count only when changed from their defaults: the default
        changes no output of a model whose template does not read it, and keeps the keys of runs
        made before the setting existed.
        """
        # judge_check changes outputs only through its verdict, which a checked run folds into llm_judge.
        out = self.model_dump(mode="json", exclude={"shard_size", "templates_dir", "judge_check"})
        if out["chat_template_kwargs"] == THINKING_OFF:
            del out["chat_template_kwargs"]
        if not out["agent_chat_template_kwargs"]:
            del out["agent_chat_template_kwargs"]
        if out["vouch"] is None:
            del out["vouch"]
        return out


def load_config(path: str | Path | None, **overrides: Any) -> HintConfig:
    """HintConfig from a YAML file (top level, or under a `hint:` key) plus CLI overrides."""
    data: dict[str, Any] = {}
    if path:
        from mentor.pipeline.io import read_yaml_mapping

        loaded = read_yaml_mapping(path, "hint settings")
        data = loaded.get("hint", loaded) if isinstance(loaded.get("hint"), dict) else loaded
    data.update({k: v for k, v in overrides.items() if v is not None})
    from pydantic import ValidationError

    try:
        return HintConfig(**data)
    except ValidationError as exc:
        where = f"{path}: " if path else ""
        msgs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}invalid hint config: {msgs}") from exc


# --------------------------------------------------------------------------- stats


HINT_STATS = StatsLayout(
    counters=(
        "problems", "accepted", "repaired", "fallback", "engine_calls", "waves", "requests", "prompt_tokens",
        "completion_tokens", "retries", "refines", "judge_calls", "keyword_leaks", "keyword_invalid", "error_leaks",
        "copied_instructions",  # keywords / errors that repeat the attribution prompt, dropped
        "trimmed",  # candidates cut back to the leading sentences that pass the rules
        "shards",
    ),
    groups={"violations": (), "parse_failures": (), "truncated": (), "requests_by_agent": (), "vouch": ()},
)
HintStats = HINT_STATS  # HintStats() makes the empty counters of a hint run


# --------------------------------------------------------------------------- one shard


class Phase(Enum):
    """Where a problem is on its way through the agents; each phase but DONE is one request per wave."""

    ATTRIBUTION = "attribution"
    GENERATION = "generation"
    JUDGMENT = "judgment"
    REPAIR = "repair"
    DONE = "done"


class TraceEntry(NamedTuple):
    """One step of a problem's trace: a model call, a rule verdict or the fallback (schema TRACE_ENTRY)."""

    agent: str  # attribution | generation | judgment | repair | rules | trim | fallback
    attempt: int
    raw: str | None
    parsed: str | None  # JSON of the parsed fields (None: the output did not parse)
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass
class _Problem:
    """The state of one problem in a shard."""

    i: int
    row: dict
    ctx: RuleContext
    max_retry: int
    max_refine: int
    threshold: float
    phase: Phase = Phase.ATTRIBUTION
    keywords: list[str] = field(default_factory=list)
    error: str | None = None
    retry: int = 0  # regenerations used
    refine: int = 0  # repairs of the current candidate
    refines: int = 0  # repairs in all
    cand_no: int = 0  # candidates produced so far (generation + repair)
    candidate: str | None = None
    last_violations: list[str] = field(default_factory=list)
    feedback: str | None = None
    rejected: list[str] = field(default_factory=list)  # why the last regenerated candidate was rejected
    seen: dict[str, None] = field(default_factory=dict)  # ordered set of every violation
    score: float | None = None
    trimmed: bool = False  # the accepted candidate was cut back by `trim_to_rules`
    hint: str = ""
    status: str = ""
    trace: list[TraceEntry] = field(default_factory=list)

    @property
    def pid(self) -> str:
        return self.row["problem_id"]


@dataclass(frozen=True)
class Agent:
    """One agent, declared: its token limit, sampling, output schema, request attempt number and message builder.

    Its output is read by the matching ``agents.parse_*`` in `_Shard.consume`.
    """

    name: str
    max_tokens: Callable[[HintConfig], int]
    sampling: Callable[[HintConfig], tuple[float, float]]  # temperature, top_p
    schema: Callable[[_Shard, _Problem], dict]
    attempt: Callable[[_Problem], int]
    messages: Callable[[_Shard, _Problem], list[dict]]


def _analysis(cfg: HintConfig) -> tuple[float, float]:
    return cfg.analysis_temperature, 1.0


def _creative(cfg: HintConfig) -> tuple[float, float]:
    return cfg.temperature, cfg.top_p


AGENTS: dict[Phase, Agent] = {
    Phase.ATTRIBUTION: Agent(
        "attribution", lambda c: c.max_tokens.attribution, _analysis, lambda s, p: s.attr_schema, lambda p: 0,
        lambda s, p: agents.attribution_messages(p.row, s.t, s.cfg.max_failed, s.cfg.failed_chars)),
    Phase.GENERATION: Agent(
        "generation", lambda c: c.max_tokens.generation, _creative, lambda s, p: s.hint_schema(p), lambda p: p.cand_no,
        lambda s, p: agents.generation_messages(p.row, p.keywords, p.error, s.t, p.rejected if p.retry else None,
                                                diagnosis=s.cfg.attribution)),
    Phase.JUDGMENT: Agent(
        "judgment", lambda c: c.max_tokens.judgment, _analysis, lambda s, p: s.judge_schema, lambda p: p.cand_no - 1,
        lambda s, p: agents.judgment_messages(p.row, p.candidate or "", s.t)),
    Phase.REPAIR: Agent(
        "repair", lambda c: c.max_tokens.repair, _creative, lambda s, p: s.hint_schema(p), lambda p: p.cand_no,
        lambda s, p: agents.repair_messages(p.row, p.candidate or "", p.last_violations, p.feedback, s.t)),
}

def _to_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


_LETTER = re.compile(r"[^\W\d_]")


class _Shard:
    """The per-shard machinery: templates, schemas, requests, and the transitions between phases."""

    def __init__(self, cfg: HintConfig, templates: agents.Templates, stats: Stats) -> None:
        self.cfg = cfg
        self.t = templates
        self.st = stats
        self.attr_schema = agents.attribution_schema(cfg.max_keywords, cfg.keyword_chars, cfg.error_chars)
        self.judge_schema = agents.judgment_schema(cfg.feedback_chars, cfg.judge_correctness)
        self.attr_instructions = Instructions.of(templates.texts["attribution_system"], templates.texts["attribution_user"])
        self.settings = {d: cfg.for_domain(d) for d in ("math", "code")}

    def hint_schema(self, p: _Problem) -> dict:
        return agents.hint_schema(p.ctx.limits.max_chars, self.cfg.reasoning_chars)

    def problem(self, i: int, row: dict) -> _Problem:
        domain = row.get("domain") or "math"
        max_retry, max_refine, threshold, limits = self.settings.get(domain, self.settings["math"])
        ctx = RuleContext(domain=domain, answer=row.get("label"), problem=row.get("problem") or "",
                          previous_hints=tuple(row.get("previous_hints") or ()), limits=limits)
        p = _Problem(i, row, ctx, max_retry, max_refine, threshold)
        self.transition(p, "start")
        return p

    # ------------------------------------------------------------------ the state machine

    def transition(self, p: _Problem, event: str, violations: Sequence[str] = (), feedback: str | None = None) -> None:
        """Every phase change, in one place.

        ========================  ==============================================================
        event                     next phase
        ========================  ==============================================================
        ``start``                 ATTRIBUTION; without attribution GENERATION; without either:
                                  the fallback (generic hint, no engine call)
        ``attributed``            GENERATION; without generation: the fallback (keyword hint)
        ``passed_rules``          JUDGMENT; without the LLM judge: accepted
        ``approved``              accepted (score >= threshold and not judged incorrect)
        ``rejected``              REPAIR while refines are left for this candidate; else
                                  GENERATION while retries are left (refines reset);
                                  else the fallback
        ========================  ==============================================================
        """
        cfg = self.cfg
        if event == "start":
            if cfg.attribution:
                p.phase = Phase.ATTRIBUTION
            elif cfg.generation:
                p.phase = Phase.GENERATION
            else:
                self._fallback(p)
        elif event == "attributed":
            if cfg.generation:
                p.phase = Phase.GENERATION
            else:
                self._fallback(p)
        elif event == "passed_rules":
            if cfg.llm_judge:
                p.phase = Phase.JUDGMENT
            else:
                self._accept(p)
        elif event == "approved":
            self._accept(p)
        elif event == "rejected":
            for v in violations:
                self.st.violations[v] += 1
                p.seen[v] = None
            p.last_violations = list(violations)
            p.feedback = feedback
            if p.candidate is not None and p.refine < p.max_refine:
                p.refine += 1
                p.refines += 1
                p.phase = Phase.REPAIR
            elif p.retry < p.max_retry:
                p.retry += 1
                p.refine = 0
                p.candidate = None
                p.score = None
                p.rejected = [v for v in violations if v not in ("parse_error", "truncated")] or list(violations)
                p.phase = Phase.GENERATION
            else:
                self._fallback(p)
        else:  # pragma: no cover - a programming error
            raise ValueError(f"unknown hint event {event!r}")

    # ------------------------------------------------------------------ requests and results

    def request(self, p: _Problem) -> GenRequest:
        a = AGENTS[p.phase]
        n = a.attempt(p)
        temperature, top_p = a.sampling(self.cfg)
        return GenRequest(f"{p.i}:{a.name}:{n}", a.messages(self, p), a.max_tokens(self.cfg), temperature, top_p,
                          self._seed(p, a.name, n), a.schema(self, p), self.cfg.template_kwargs(a.name))

    def _seed(self, p: _Problem, agent: str, n: int) -> int:
        return zlib.crc32(f"{self.cfg.seed}|{p.pid}|{agent}|{n}".encode()) & 0x7FFFFFFF

    def consume(self, p: _Problem, res: GenResult) -> None:
        agent = AGENTS[p.phase].name
        self.st.requests_by_agent[agent] += 1
        if res.finish_reason == "length":
            self.st.truncated[agent] += 1
        if p.phase is Phase.ATTRIBUTION:
            self._attributed(p, res)
        elif p.phase is Phase.JUDGMENT:
            self._judged(p, res)
        else:
            self._candidate(p, res)

    def _attributed(self, p: _Problem, res: GenResult) -> None:
        st, cfg = self.st, self.cfg
        parsed = agents.parse_attribution(res.text, p.row, cfg.max_keywords, cfg.keyword_chars, cfg.error_chars)
        self._trace(p, "attribution", 0, res, parsed)
        if parsed is None:
            st.parse_failures["attribution"] += 1
        else:
            leaks = p.ctx.matcher.leaks
            # Keywords are concepts: one without a letter ("1.1.1", "2400") is noise, one that carries
            # the answer would reach the generation prompt and the fallback hint.
            worded = [k for k in parsed["keywords"] if _LETTER.search(k)]
            kws = [k for k in worded if not leaks(k)]
            st.keyword_invalid += len(parsed["keywords"]) - len(worded)
            st.keyword_leaks += len(worded) - len(kws)
            # A weak model parrots its instructions ("failed attempts", "the attempts are data to analyse").
            own = [k for k in kws if not copies_instructions(k, self.attr_instructions, p.ctx.problem)]
            st.copied_instructions += len(kws) - len(own)
            p.keywords = own
            err = parsed["error"]
            if err and not _LETTER.search(err):
                st.keyword_invalid += 1  # "4000" is not a diagnosis
                err = None
            if err and leaks(err):
                st.error_leaks += 1  # never let the answer reach the generation prompt
                err = None
            if err and copies_instructions(err, self.attr_instructions, p.ctx.problem):
                st.copied_instructions += 1
                err = None
            p.error = err
        self.transition(p, "attributed")

    def _judged(self, p: _Problem, res: GenResult) -> None:
        self.st.judge_calls += 1
        parsed = agents.parse_judgment(res.text, p.row, self.cfg.feedback_chars)
        self._trace(p, "judgment", p.cand_no - 1, res, parsed)
        if parsed is None:
            self.st.parse_failures["judgment"] += 1
            self.transition(p, "rejected", ["judge_parse_error"])
            return
        p.score = parsed["score"]
        if parsed.get("correct") is False:
            self.transition(p, "rejected", ["judge_incorrect"], parsed["feedback"])
        elif p.score >= p.threshold:
            self.transition(p, "approved")
        else:
            self.transition(p, "rejected", ["judge_low_score"], parsed["feedback"])

    def _candidate(self, p: _Problem, res: GenResult) -> None:
        """A generated or repaired hint: parse it, run the rules."""
        agent = AGENTS[p.phase].name
        parsed = agents.parse_hint(res.text, p.row)
        n = p.cand_no
        p.cand_no += 1
        self._trace(p, agent, n, res, parsed)
        if parsed is None:
            self.st.parse_failures[agent] += 1
            truncated = res.finish_reason == "length"
            self.transition(p, "rejected", ["parse_error", "truncated"] if truncated else ["parse_error"])
            return
        p.candidate = parsed["hint"]
        violations = check_hint(p.candidate, p.ctx)
        p.trace.append(TraceEntry("rules", n, p.candidate, _to_json({"ok": not violations, "violations": violations}), None, 0, 0))
        trimmed = trim_to_rules(p.candidate, p.ctx, violations) if self.cfg.trim_hints else None
        p.trimmed = trimmed is not None
        if trimmed is not None:
            self.st.trimmed += 1
            p.trace.append(TraceEntry("trim", n, trimmed, _to_json({"ok": True, "cut": violations}), None, 0, 0))
            p.candidate, violations = trimmed, []
        if violations:
            self.transition(p, "rejected", violations)
        else:
            self.transition(p, "passed_rules")

    def _trace(self, p: _Problem, agent: str, n: int, res: GenResult, parsed: dict | None) -> None:
        p.trace.append(TraceEntry(agent, n, res.text, None if parsed is None else _to_json(parsed),
                                  res.finish_reason, res.prompt_tokens, res.completion_tokens))

    # ------------------------------------------------------------------ endings

    def _accept(self, p: _Problem) -> None:
        p.hint = p.candidate or ""
        p.status = "accepted" if p.retry == 0 and p.refines == 0 and not p.trimmed else "repaired"
        p.phase = Phase.DONE

    def _fallback(self, p: _Problem) -> None:
        """A safe default: from the keywords when the rules pass it, else a generic one."""
        t = self.t
        domain = p.ctx.domain if p.ctx.domain in ("math", "code") else "math"
        options: list[tuple[str, str]] = []
        if p.keywords:
            kws = p.keywords
            joined = kws[0] if len(kws) == 1 else ", ".join(kws[:-1]) + " and " + kws[-1]
            options.append(("keywords", " ".join(t.render("fallback_keywords", keywords=joined).split())))
        options.extend(("generic", line) for line in t.lines(f"fallback_{domain}"))
        chosen, rejected = options[-1], {}
        for source, text in options:
            v = check_hint(text, p.ctx)
            if not v:
                chosen = (source, text)
                break
            rejected[source if source == "keywords" else text[:40]] = v
        p.hint = chosen[1]
        p.score = None
        p.status = "fallback"
        p.phase = Phase.DONE
        p.trace.append(TraceEntry("fallback", p.cand_no, chosen[1], json.dumps({"source": chosen[0], "rejected": rejected}), None, 0, 0))


def hint_shard(
    rows: Sequence[dict] | pa.Table,
    cfg: HintConfig,
    backend: Backend,
    stats: Stats | None = None,
    progress: Callable[[int, int], None] | None = None,
    templates: agents.Templates | None = None,
) -> pa.Table:
    """Hint every collapsed row (schema: hints, same order as `rows`).

    Pure in its rows: no I/O besides the backend. One backend call per wave.
    `stats` (if given) is filled in; `progress(problems_finished, wave)` is
    called after each wave.
    """
    if isinstance(rows, pa.Table):
        rows = rows.to_pylist()
    st = stats if stats is not None else HintStats()
    t = templates or agents.Templates.load(cfg.templates_dir)
    shard = _Shard(cfg, t, st)
    problems = [shard.problem(i, row) for i, row in enumerate(rows)]
    calls0, pt0, ct0 = backend.calls, backend.prompt_tokens, backend.completion_tokens
    pending = [p for p in problems if p.phase is not Phase.DONE]
    while pending:
        t0 = time.perf_counter()
        results = backend.generate([shard.request(p) for p in pending])
        st.waves += 1
        if log.isEnabledFor(logging.INFO):
            in_wave = Counter(p.phase.value for p in pending)
            log.info("wave %d: %d requests %s in %.1f s", st.waves, len(pending), dict(in_wave), time.perf_counter() - t0)
        st.requests += len(pending)
        for p, res in zip(pending, results):
            shard.consume(p, res)
        still = [p for p in pending if p.phase is not Phase.DONE]
        if progress is not None:
            progress(len(pending) - len(still), st.waves)
        pending = still
    st.engine_calls += backend.calls - calls0
    st.prompt_tokens += backend.prompt_tokens - pt0
    st.completion_tokens += backend.completion_tokens - ct0
    st.problems += len(problems)
    st.shards += 1
    for p in problems:
        if p.status == "accepted":
            st.accepted += 1
        elif p.status == "repaired":
            st.repaired += 1
        else:
            st.fallback += 1
        st.retries += p.retry
        st.refines += p.refines
    model = getattr(backend, "model", "unknown")
    return _to_table(problems, model, t.version, row_config_hash(cfg, model))


def row_config_hash(cfg: HintConfig, model: str) -> str:
    from mentor.pipeline.io import config_hash

    return config_hash({"hint": cfg.semantic(), "model": model})


def _to_table(problems: list[_Problem], model: str, prompt_version: str, cfg_hash: str) -> pa.Table:
    trace = [[e._asdict() for e in p.trace] for p in problems]
    hints = [p.hint for p in problems]
    columns = {
        "problem_id": [p.pid for p in problems],
        "round": [int(p.row.get("round") or 0) for p in problems],
        "hint_id": [content_hash(p.pid, p.hint) for p in problems],
        "hint": hints,
        "keywords": [p.keywords for p in problems],
        "error": [p.error for p in problems],
        "status": [p.status for p in problems],
        "retries": [p.retry for p in problems],
        "refines": [p.refines for p in problems],
        "judge_score": [p.score for p in problems],
        "violations": [list(p.seen) for p in problems],
        "trace": trace,
        "model": [model] * len(problems),
        "prompt_version": [prompt_version] * len(problems),
        "config_hash": [cfg_hash] * len(problems),
        "vouch": [None] * len(problems),  # filled by stages/vouch.py when the policy vouches
    }
    schema = pa.schema(list(HINTS), metadata=schema_metadata("hints"))
    return pa.Table.from_pydict(columns, schema=schema)


# --------------------------------------------------------------------------- shards on disk

@dataclass
class ShardTask:
    """One shard's work, small enough to ship to a dask worker."""

    index: int
    key: str
    rows: list[dict]
    shard_path: str
    done_path: str
    total: int = 1  # shards in the run (for messages)


def shard_done(task: ShardTask) -> dict | None:
    """The done marker's content when the shard's output is complete, else None."""
    return read_done(task.done_path, task.key) if Path(task.shard_path).is_file() else None


def run_shard(task: ShardTask, cfg: HintConfig, backend_factory: Callable[[], Backend],
              progress: Callable[[int, int], None] | None = None) -> dict:
    """Hint one shard and write it (parquet first, then the done marker). Top-level: picklable for dask."""
    from mentor.pipeline.io import write_parquet_atomic

    marker = shard_done(task)
    if marker is not None:  # e.g. a dask task retried after its worker died past the write
        return {"stats": marker["stats"], "reused": True}
    st = HintStats()
    started, starts = time.time(), engine_starts()
    try:
        if cfg.vouch is not None:
            from mentor.stages.vouch import vouch_shard

            table = vouch_shard(task.rows, cfg, backend_factory(), stats=st, progress=progress)
        else:
            table = hint_shard(task.rows, cfg, backend_factory(), stats=st, progress=progress)
    except EngineError as exc:
        first = task.rows[0]["problem_id"] if task.rows else "-"
        raise EngineError(
            f"hint: shard {task.index + 1} of {task.total} ({len(task.rows)} problems from {first}) failed after "
            f"{st.waves} waves: {exc}. Finished shards are kept: rerun the same command to redo only the unfinished ones"
        ) from exc
    write_parquet_atomic(table, task.shard_path, dataset="hints")
    stats = st.as_dict()
    write_done(task.done_path, task.key, index=task.index, rows=table.num_rows, stats=stats)
    from mentor.pipeline.faults import fault_point

    fault_point("hint.after_shard")
    ran = {"index": task.index, "worker": f"{socket.gethostname()}:{os.getpid()}", "started": round(started, 3),
           "finished": round(time.time(), 3), "engine_started": engine_starts() > starts}
    return {"stats": stats, "reused": False, "ran": ran}


class _Ticker:
    """``progress(problems, wave)`` for `run_shard`: moves the bar in the process that made it.

    A task run elsewhere (a dask worker process) gets a copy that does nothing; the
    bar then moves when the shard's result comes back.
    """

    _bars: dict[int, Any] = {}

    def __init__(self, bar: Any) -> None:
        self.pid, self.key = os.getpid(), id(bar)
        self._bars[self.key] = bar

    def __call__(self, n: int, wave: int) -> None:
        bar = self._bars.get(self.key) if os.getpid() == self.pid else None
        if bar is not None:
            bar.update(n)
            bar.set_postfix(wave=wave, refresh=False)

    def close(self) -> None:
        self._bars.pop(self.key, None)


def input_hash(rows: list[dict]) -> str:
    blob = json.dumps(rows, sort_keys=True, ensure_ascii=False, default=str)
    return content_hash(blob, length=24)


def describe_factory(factory: Callable[[], Backend]) -> Any:
    if hasattr(factory, "describe"):
        return factory.describe()
    return {"factory": getattr(factory, "__qualname__", type(factory).__name__)}


def shard_size_for(cfg: HintConfig, n: int, executor: Executor | None) -> int:
    """Problems per shard: the config's, or, when it was not set and dask has W engine workers, ``ceil(n / W)``.

    One shard is one worker's batch of waves: with the default (512) a run of 432
    problems would keep 1 of 8 engines busy. A shard size given in the config is kept.
    """
    workers = getattr(executor, "workers", lambda: 1)()
    if "shard_size" in cfg.model_fields_set or workers <= 1 or n <= 0:
        return cfg.shard_size
    return min(cfg.shard_size, -(-n // workers))


def hint_to_dir(
    collapsed_path: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    cfg: HintConfig,
    backend_factory: Callable[[], Backend],
    executor: Executor | None = None,
    sample: int | None = None,
    progress: bool = False,
) -> Stats:
    """Hint a collapsed dataset into ``out_dir/hints.parquet`` and ``out_dir/stats.json``.

    Shards live in ``out_dir/_shards/<key>.parquet`` with ``<key>.done.json``
    beside them; `key` hashes the shard's rows, the config, the prompt
    version and the backend description, so finished shards are reused and
    any change recomputes exactly what it affects.
    """
    from tqdm.auto import tqdm

    from mentor.pipeline.io import config_hash, read_table, resolve_inputs, write_parquet_atomic

    sources = [collapsed_path] if isinstance(collapsed_path, (str, Path)) else list(collapsed_path)
    paths = resolve_inputs(sources)
    table = read_table(paths, "collapsed").sort_by("problem_id")
    whole = table  # the judge check draws on every collapsed problem, not only the --sample
    if sample is not None:
        if sample < 1:
            raise ConfigError(f"--sample must be >= 1, got {sample}")
        table = table.slice(0, sample)
    rows = table.to_pylist()
    templates = agents.Templates.load(cfg.templates_dir)
    from mentor.stages.judge_check import checked_config, stats_view
    from mentor.stages.vouch import per_rescued as _per_rescued

    given = cfg
    try:
        cfg, judge_report = checked_config(cfg, whole, out_dir, templates, backend_factory, executor, describe_factory)
    except BaseException:
        release_engines(executor)  # the check's engine ends with the stage, however it ends
        raise
    run_key = config_hash(
        {"hint": cfg.semantic(), "prompt_version": templates.version, "backend": describe_factory(backend_factory),
         "schema": SCHEMA_VERSION}
    )
    out_dir = Path(out_dir)
    shard_dir = out_dir / "_shards"
    tasks: list[ShardTask] = []
    size = shard_size_for(cfg, len(rows), executor)
    for index, start in enumerate(range(0, len(rows), size)):
        chunk = rows[start : start + size]
        key = content_hash(run_key, input_hash(chunk), length=24)
        tasks.append(ShardTask(index, key, chunk, str(shard_dir / f"{key}.parquet"), str(shard_dir / f"{key}.done.json"),
                               total=-(-len(rows) // size)))
    todo = [t for t in tasks if shard_done(t) is None]
    stats = HintStats()
    todo_ids = {t.index for t in todo}
    reused = [t for t in tasks if t.index not in todo_ids]
    for t in reused:
        stats.merge(shard_done(t)["stats"])  # type: ignore[index]
    bar = tqdm(total=len(rows), desc="hint", unit="problem", disable=not progress, dynamic_ncols=True)
    finished = sum(len(t.rows) for t in reused)
    bar.update(finished)
    ticker = _Ticker(bar)
    run_calls = 0
    results = []
    executor = executor or LocalExecutor()
    try:
        for task, result in zip(todo, executor.imap(run_shard, todo, cfg, backend_factory, ticker)):
            results.append(result)
            finished += len(task.rows)
            bar.update(finished - bar.n)  # what the ticker could not show (a shard run elsewhere)
    finally:
        ticker.close()
        bar.close()
        release_engines(executor)  # here and on every worker: the next stage (a trainer) gets the memory
    for r in results:
        stats.merge(r["stats"])
        if not r["reused"]:
            run_calls += r["stats"]["engine_calls"]
    import pyarrow.parquet as pq

    from mentor.pipeline.schemas import conform

    parts = [conform(pq.read_table(t.shard_path), "hints") for t in tasks]  # shards written before the vouch column too
    hints = pa.concat_tables(parts) if parts else HINTS.empty_table()
    write_parquet_atomic(hints, out_dir / "hints.parquet", dataset="hints")
    # Shards of an earlier input or config are not part of this output (a killed run never gets here).
    keep = {name for t in tasks for name in (Path(t.shard_path).name, Path(t.done_path).name)}
    for stale in shard_dir.iterdir() if shard_dir.is_dir() else ():
        if stale.is_file() and stale.name not in keep:
            stale.unlink()
    if judge_report is not None and not judge_report.get("reused"):
        run_calls += judge_report.get("engine_calls", 0)
    summary = stats.as_dict() | {
        "judge_check": stats_view(judge_report),
        **({"vouch_per_rescued": _per_rescued(stats.as_dict())} if cfg.vouch is not None else {}),
        "this_run": {
            "engine_calls": run_calls,
            "shards_computed": sum(1 for r in results if not r["reused"]),
            "shards_reused": len(tasks) - sum(1 for r in results if not r["reused"]),
        },
        # where each shard computed by this run ran, when, and whether its worker had to start an engine for it
        "shard_runs": [r["ran"] for r in results if "ran" in r],
        "prompt_version": templates.version,
        "backend": describe_factory(backend_factory),
        "config": given.model_dump(mode="json"),
        "inputs": [str(p) for p in paths],
        "sample": sample,
    }
    write_stats(out_dir, summary)
    log.info("hinted %d problems: %d accepted, %d repaired, %d fallback, %d engine calls",
             stats.problems, stats.accepted, stats.repaired, stats.fallback, stats.engine_calls)
    return stats
