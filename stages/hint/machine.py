"""The hint state machine: one shard of collapsed problems through the four agents, in waves.

Waves. Every pending problem of a shard takes its next agent step in the same
wave, and a wave is ONE backend call (requests of different agents mixed), so
engine calls grow with the number of waves, never with the number of
problems. A server (a ``concurrent`` backend) gets no waves: each problem sends
its next request as soon as its last one is answered (`_chains`), so the server's
batch never drains to the slowest request of a wave. A problem's path:

    attribution -> generation -> rules [-> judgment] -> accepted
                                   | fail                 | low score
                                   v                      v
                       repair (up to max_refine) -> rules [-> judgment] -> ...
                                   | still failing
                                   v
                       regenerate (up to max_retry) ... -> safe fallback

The phases are `Phase`, one per agent file of ``stages/hint/agents/`` (`Agent`:
its messages, JSON schema, parser, sampling, token limit, what it adds to a
problem's state, and `consume`, what its answer does), which `HintMachine` calls
alike for every agent; every phase change happens in `HintMachine.transition`,
which picks the next agent by its declared role (analysis, generate, review,
repair; `mentor.stages.hint.agent`) and its on/off switch. Rules run locally between waves (no engine call); only a hint
that passes them is sent to the LLM judge. Bad model output (invalid JSON, empty text,
truncation, a hint in another language, keywords that are the answer, a
failed trajectory that carries instructions) only ever moves a problem along
this path, and is counted in the stats; so does a request that got no answer
(``failed_calls``: a server's error after its retries, a prompt too long for the
engine). A shard none of whose requests got an answer fails (`EngineError`).

`hint_shard(rows, cfg, backend)` is a pure function of its rows (the seeds of
every request derive from problem ids, not positions); the stage
(`mentor.stages.hint`) runs it over resumable shards, the judge check
(`judge_check`) asks the same machine for its judgment requests, and vouching
(`vouch`) calls `hint_shard` once per candidate.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, make_dataclass
from enum import Enum
from typing import Any, NamedTuple

import pyarrow as pa

from mentor.pipeline.errors import ConfigError, EngineError
from mentor.pipeline.ids import content_hash
from mentor.pipeline.io import config_hash
from mentor.pipeline.llm import Backend, GenRequest, GenResult, concurrently
from mentor.pipeline.schemas import HINTS, schema_metadata
from mentor.pipeline.stage import Stats, StatsLayout
from mentor.stages.hint.agents import AGENTS, by_role
from mentor.stages.hint.config import HintConfig
from mentor.stages.hint.prompt_templates import Templates
from mentor.stages.hint.tokens import hint_control_tokens
from mentor.stages.rules import RuleContext, RuleLimits, check_hint, trim_to_rules

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- stats


HINT_STATS = StatsLayout(
    counters=(
        "problems", "accepted", "repaired", "fallback", "engine_calls", "waves", "requests", "prompt_tokens",
        "completion_tokens", "retries", "refines",
        *(c for a in AGENTS.values() for c in a.counters),  # each agent's own (attribution: keyword_leaks, ...)
        "failed_calls",  # requests without an answer (a server's error after its retries, a prompt too long)
        "trimmed",  # candidates cut back to the leading sentences that pass the rules
        "shards",
    ),
    groups={"violations": (), "parse_failures": (), "truncated": (), "requests_by_agent": (), "vouch": ()},
)
HintStats = HINT_STATS  # HintStats() makes the empty counters of a hint run


# --------------------------------------------------------------------------- one shard


# Where a problem is on its way through the agents: one phase per agent (`AGENTS`), each one
# request per wave, and DONE.
Phase = Enum("Phase", {**{name.upper(): name for name in AGENTS}, "DONE": "done"})
ANALYSIS, REVIEW = by_role("analysis"), by_role("review")
(GENERATE,), (REPAIR,) = by_role("generate"), by_role("repair")


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
class CoreState:
    """The state of one problem in a shard (what the machine itself keeps; `ProblemState` adds the agents' fields)."""

    i: int
    row: dict
    ctx: RuleContext
    max_retry: int
    max_refine: int
    threshold: float
    phase: Phase = Phase.DONE
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


def _agent_fields() -> list[tuple[str, Any, Any]]:
    """Every agent's declared `state` fields (attribution: keywords, error), each declared once."""
    owner: dict[str, str] = {name: "the state machine" for name in CoreState.__dataclass_fields__}
    out = []
    for a in AGENTS.values():
        for name, factory in a.state.items():
            if name in owner:
                raise ConfigError(f"agent {a.name!r} ({type(a).__module__}): its state field {name!r} is "
                                  f"{owner[name]}'s; rename it")
            owner[name] = f"agent {a.name!r}"
            out.append((name, Any, field(default_factory=factory)))
    return out


# The state of one problem: `CoreState` and the agents' fields.
ProblemState = make_dataclass("ProblemState", _agent_fields(), bases=(CoreState,))
ProblemState.__module__ = __name__


def _to_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)



class HintMachine:
    """The per-shard machinery: requests from the agents' records, and the transitions between phases."""

    def __init__(self, cfg: HintConfig, templates: Templates, stats: Stats,
                 control_tokens: tuple[str, ...] | None = None) -> None:
        self.cfg = cfg
        self.control_tokens = control_tokens  # rule special_token's list (None: the built-in one)
        self.t = templates
        self.st = stats
        self.memo: dict[str, Any] = {}  # per shard, for the agents' own use
        self.settings = {d: cfg.for_domain(d) for d in ("math", "code")}
        self.schemas: dict[tuple[str, RuleLimits], dict] = {}  # (agent, a domain's limits) -> its JSON schema

    def problem(self, i: int, row: dict) -> ProblemState:
        domain = row.get("domain") or "math"
        max_retry, max_refine, threshold, limits = self.settings.get(domain, self.settings["math"])
        ctx = RuleContext.of_row(row, limits, self.control_tokens)
        p = ProblemState(i, row, ctx, max_retry, max_refine, threshold)
        self.transition(p, "start")
        return p

    def judgment_request(self, i: int, row: dict, hint: str) -> GenRequest:
        """The request the run sends to judge `hint` as the first candidate for `row` (id ``i:judgment:0``):
        the judge check (`judge_check`) scores the judge on exactly what a run would ask it."""
        p = self.problem(i, row)
        p.candidate, p.cand_no = hint, 1
        p.phase = Phase(REVIEW[0].name)  # the built-in reviewer, the judge
        return self.request(p)

    # ------------------------------------------------------------------ the state machine

    def transition(self, p: ProblemState, event: str, violations: Sequence[str] = (), feedback: str | None = None) -> None:
        """Every phase change, in one place.

        ========================  ==============================================================
        event                     next phase
        ========================  ==============================================================
        ``start``                 the first enabled analysis agent (ATTRIBUTION); none: the
                                  generate agent (GENERATION); that off too: the fallback
                                  (generic hint, no engine call)
        ``analysed``              the next enabled analysis agent; else as ``start`` after it
        ``passed_rules``          the first enabled review agent (JUDGMENT); none: accepted
        ``approved``              the next enabled review agent; none: accepted (for the judge:
                                  score >= threshold and not judged incorrect)
        ``rejected``              REPAIR while refines are left for this candidate; else
                                  GENERATION while retries are left (refines reset);
                                  else the fallback
        ========================  ==============================================================
        """
        cfg = self.cfg
        if event in ("start", "analysed"):
            after = ANALYSIS.index(AGENTS[p.phase.value]) + 1 if event == "analysed" else 0
            nxt = next((a for a in ANALYSIS[after:] if a.enabled(cfg)), None)
            if nxt is not None:
                p.phase = Phase(nxt.name)
            elif GENERATE.enabled(cfg):
                p.phase = Phase(GENERATE.name)
            else:
                self._fallback(p)
        elif event in ("passed_rules", "approved"):
            after = REVIEW.index(AGENTS[p.phase.value]) + 1 if event == "approved" else 0
            nxt = next((a for a in REVIEW[after:] if a.enabled(cfg)), None)
            if nxt is not None:
                p.phase = Phase(nxt.name)
            else:
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
                p.phase = Phase(REPAIR.name)
            elif p.retry < p.max_retry:
                p.retry += 1
                p.refine = 0
                p.candidate = None
                p.score = None
                p.rejected = [v for v in violations if v not in ("parse_error", "truncated")] or list(violations)
                p.phase = Phase(GENERATE.name)
            else:
                self._fallback(p)
        else:  # pragma: no cover - a programming error
            raise ValueError(f"unknown hint event {event!r}")

    # ------------------------------------------------------------------ requests and results

    def request(self, p: ProblemState) -> GenRequest:
        a, cfg = AGENTS[p.phase.value], self.cfg
        n = a.attempt(p)
        key = (a.name, p.ctx.limits)
        schema = self.schemas.get(key)
        if schema is None:
            schema = self.schemas[key] = a.schema(cfg, p.ctx.limits)
        temperature, top_p = a.sampling(cfg)
        max_tokens = a.max_tokens(cfg)
        if cfg.thinks(a.name):  # room to think, and no grammar forcing "{" before it (`HintConfig.thinks`)
            max_tokens, schema = max_tokens + cfg.max_tokens.thinking, None
        return GenRequest(f"{p.i}:{a.name}:{n}", a.messages(p, cfg, self.t), max_tokens, temperature, top_p,
                          self._seed(p, a.name, n), schema, cfg.template_kwargs(a.name))

    def _seed(self, p: ProblemState, agent: str, n: int) -> int:
        return zlib.crc32(f"{self.cfg.seed}|{p.pid}|{agent}|{n}".encode()) & 0x7FFFFFFF

    def consume(self, p: ProblemState, res: GenResult) -> None:
        """Read an answer with its agent's parser (raw text always traced), then take the phase's transition."""
        a, st = AGENTS[p.phase.value], self.st
        st.requests_by_agent[a.name] += 1
        if res.finish_reason == "length":
            st.truncated[a.name] += 1
        parsed = a.parse(res.text, self.cfg)
        p.trace.append(TraceEntry(a.name, a.attempt(p), res.text, None if parsed is None else _to_json(parsed),
                                  res.finish_reason, res.prompt_tokens, res.completion_tokens))
        if parsed is None:
            st.parse_failures[a.name] += 1
        a.consume(p, res, parsed, self)

    def candidate(self, p: ProblemState, res: GenResult, parsed: dict | None) -> None:
        """A generated or repaired hint (a generate or repair agent's answer): run the rules."""
        n = p.cand_no
        p.cand_no += 1
        if parsed is None:
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

    # ------------------------------------------------------------------ endings

    def _accept(self, p: ProblemState) -> None:
        p.hint = p.candidate or ""
        p.status = "accepted" if p.retry == 0 and p.refines == 0 and not p.trimmed else "repaired"
        p.phase = Phase.DONE

    def _fallback(self, p: ProblemState) -> None:
        """A safe default: from the keywords when the rules pass it, else a generic one."""
        t = self.t
        domain = p.ctx.domain if p.ctx.domain in ("math", "code") else "math"
        options: list[tuple[str, str]] = []
        kws = getattr(p, "keywords", None)  # the attribution's
        if kws:
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
    templates: Templates | None = None,
) -> pa.Table:
    """Hint every collapsed row (schema: hints, same order as `rows`).

    Pure in its rows: no I/O besides the backend. One backend call per wave.
    `stats` (if given) is filled in; `progress(problems_finished, wave)` is
    called after each wave.
    """
    if isinstance(rows, pa.Table):
        rows = rows.to_pylist()
    st = stats if stats is not None else HintStats()
    t = templates or Templates.load(cfg.templates_dir)
    shard = HintMachine(cfg, t, st, hint_control_tokens(cfg, backend))
    problems = [shard.problem(i, row) for i, row in enumerate(rows)]
    calls0, pt0, ct0 = backend.calls, backend.prompt_tokens, backend.completion_tokens
    requests0, errors = st.requests, []

    def answered(p: ProblemState, res: GenResult) -> None:
        """A request without an answer is a failed model call, counted; its problem moves on as after a parse failure."""
        if res.finish_reason == "error":
            st.failed_calls += 1
            errors.append(res.error or "no reason given")
        shard.consume(p, res)

    pending = [p for p in problems if p.phase is not Phase.DONE]
    if getattr(backend, "concurrent", False):
        _chains(shard, pending, backend, answered, progress)
        pending = []
    while pending:
        t0 = time.perf_counter()
        results = backend.generate([shard.request(p) for p in pending])
        st.waves += 1
        if log.isEnabledFor(logging.INFO):
            in_wave = Counter(p.phase.value for p in pending)
            log.info("wave %d: %d requests %s in %.1f s", st.waves, len(pending), dict(in_wave), time.perf_counter() - t0)
        st.requests += len(pending)
        for p, res in zip(pending, results):
            answered(p, res)
        still = [p for p in pending if p.phase is not Phase.DONE]
        if progress is not None:
            progress(len(pending) - len(still), st.waves)
        pending = still
    asked = st.requests - requests0
    if asked and len(errors) == asked:
        url = getattr(backend, "base_url", None)
        who = f"the server at {url}" if url else "the model"
        raise EngineError(f"{who} answered none of the {asked} requests (e.g. {errors[0]})")
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


def _chains(shard: HintMachine, problems: list[ProblemState], backend: Backend, answered: Callable[[ProblemState, GenResult], None],
            progress: Callable[[int, int], None] | None) -> None:
    """Each problem's requests one after another, problems side by side (a server): no wave waits for its slowest request.

    As many problems run at once as the backend keeps requests in flight (``max_concurrency``);
    when one finishes the next starts, so the server always has a full batch. The state machine
    is the same; its steps are taken under one lock (they are quick and local), the requests
    outside it. ``waves`` counts the steps of the longest chain, ``requests`` every request.
    """
    st, lock, stop = shard.st, threading.Lock(), threading.Event()
    longest = 0

    def run(p: ProblemState) -> None:
        nonlocal longest
        steps = 0
        while not stop.is_set():
            with lock:
                if p.phase is Phase.DONE:
                    break
                req = shard.request(p)
            (res,) = backend.generate([req])
            steps += 1
            with lock:
                st.requests += 1
                answered(p, res)
        with lock:
            longest = max(longest, steps)
            if progress is not None and p.phase is Phase.DONE:
                progress(1, longest)

    width = min(getattr(backend, "max_concurrency", 64), 1024)
    try:
        for _ in concurrently(run, problems, width, "mentor-hint"):  # the first error (a broken server) ends the shard
            pass
    finally:
        stop.set()  # chains still running send no further request
    st.waves += longest


def row_config_hash(cfg: HintConfig, model: str) -> str:
    return config_hash({"hint": cfg.semantic(), "model": model})


def _to_table(problems: list[ProblemState], model: str, prompt_version: str, cfg_hash: str) -> pa.Table:
    trace = [[e._asdict() for e in p.trace] for p in problems]
    hints = [p.hint for p in problems]
    columns = {
        "problem_id": [p.pid for p in problems],
        "round": [int(p.row.get("round") or 0) for p in problems],
        "hint_id": [content_hash(p.pid, p.hint) for p in problems],
        "hint": hints,
        "keywords": [getattr(p, "keywords", []) for p in problems],
        "error": [getattr(p, "error", None) for p in problems],
        "status": [p.status for p in problems],
        "retries": [p.retry for p in problems],
        "refines": [p.refines for p in problems],
        "judge_score": [p.score for p in problems],
        "violations": [list(p.seen) for p in problems],
        "trace": trace,
        "model": [model] * len(problems),
        "prompt_version": [prompt_version] * len(problems),
        "config_hash": [cfg_hash] * len(problems),
        "vouch": [None] * len(problems),  # filled by vouch.py when the policy vouches
    }
    schema = pa.schema(list(HINTS), metadata=schema_metadata("hints"))
    return pa.Table.from_pydict(columns, schema=schema)


# --------------------------------------------------------------------------- the stage



__all__ = ["HINT_STATS", "HintMachine", "HintStats", "Phase", "ProblemState", "TraceEntry", "hint_shard", "row_config_hash"]
