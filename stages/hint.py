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

Rules run locally between waves (no engine call); only a hint that passes
them is sent to the LLM judge. Bad model output (invalid JSON, empty text,
truncation, a hint in another language, keywords that are the answer, a
failed trajectory that carries instructions) only ever moves a problem along
this path, and is counted in the stats.

Shards. `hint_shard(rows, cfg, backend)` is a pure function of its rows (the
seeds of every request derive from problem ids, not positions); `hint_to_dir`
splits the collapsed set into shards, runs them with a pluggable
``map_fn(fn, items, *args)`` (in-process, or dask workers that each own one
engine built from a picklable `BackendSpec`), writes each shard atomically
with a done marker keyed by the shard's input hash and the config hash, and
concatenates them into ``hints.parquet`` + ``stats.json``. A killed run
resumes without redoing finished shards; a re-run of the same inputs and
config makes no engine call (and starts no engine).
"""

from __future__ import annotations

import json
import logging
import re
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from mentor.pipeline.errors import ConfigError, EngineError
from mentor.pipeline.ids import content_hash
from mentor.pipeline.llm import Backend, GenRequest, GenResult
from mentor.pipeline.schemas import HINTS, SCHEMA_VERSION, TRACE_ENTRY, schema_metadata
from mentor.stages import hint_agents as agents
from mentor.stages.hint_rules import Instructions, RuleContext, RuleLimits, check_hint, copies_instructions

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- config


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
    max_hint_chars: int = Field(400, ge=40, description="Longest acceptable hint, characters (also the JSON schema's maxLength).")
    max_hint_sentences: int = Field(4, ge=1, description="Most sentences in a hint.")
    max_keywords: int = Field(5, ge=1, le=20, description="Keywords the attribution agent may return.")
    keyword_chars: int = Field(40, ge=4, description="Longest keyword, characters.")
    error_chars: int = Field(240, ge=16, description="Longest attributed error, characters.")
    feedback_chars: int = Field(240, ge=16, description="Longest judge feedback, characters.")
    max_failed: int = Field(2, ge=0, description="Failed responses shown to the attribution agent.")
    failed_chars: int = Field(1500, ge=64, description="Characters kept per failed response in the prompt (mostly its end).")
    templates_dir: str | None = Field(None, description="Directory whose <name>.txt files replace the bundled prompt templates.")
    shard_size: int = Field(512, ge=1, description="Problems per shard (one shard = one batch of waves; dask runs shards in parallel).")

    def for_domain(self, domain: str) -> tuple[int, int, float, RuleLimits]:
        o = self.domains.get(domain)  # type: ignore[call-overload]
        pick = lambda name: getattr(o, name) if o is not None and getattr(o, name) is not None else getattr(self, name)  # noqa: E731
        limits = RuleLimits(max_chars=pick("max_hint_chars"), max_sentences=pick("max_hint_sentences"))
        return pick("max_retry"), pick("max_refine"), pick("judge_threshold"), limits

    def semantic(self) -> dict[str, Any]:
        """The settings that change outputs (not how the work is split or where templates live)."""
        return self.model_dump(mode="json", exclude={"shard_size", "templates_dir"})


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


@dataclass
class HintStats:
    problems: int = 0
    accepted: int = 0
    repaired: int = 0
    fallback: int = 0
    engine_calls: int = 0
    waves: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    refines: int = 0
    judge_calls: int = 0
    keyword_leaks: int = 0
    keyword_invalid: int = 0
    error_leaks: int = 0
    copied_instructions: int = 0  # keywords / errors that repeat the attribution prompt, dropped
    violations: Counter = field(default_factory=Counter)
    parse_failures: Counter = field(default_factory=Counter)
    truncated: Counter = field(default_factory=Counter)
    requests_by_agent: Counter = field(default_factory=Counter)
    shards: int = 0

    def add(self, other: dict[str, Any]) -> None:
        for k, v in other.items():
            cur = getattr(self, k, None)
            if isinstance(cur, Counter):
                cur.update(v)
            elif isinstance(cur, int):
                setattr(self, k, cur + int(v))

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k, v in d.items():
            if isinstance(v, Counter):
                d[k] = dict(sorted(v.items()))
        return d


# --------------------------------------------------------------------------- one shard

_to_json = json.JSONEncoder(ensure_ascii=False).encode  # one encoder, not one per call
_RULES_OK = _to_json({"ok": True, "violations": []})
ATTR, GEN, JUDGE, REPAIR, DONE = range(5)
_LETTER = re.compile(r"[^\W\d_]")
AGENT = ("attribution", "generation", "judgment", "repair", "done")


class _Problem:
    __slots__ = (
        "i", "row", "pid", "ctx", "max_retry", "max_refine", "threshold", "keywords", "error",
        "phase", "retry", "refine", "refines", "cand_no", "candidate", "last_violations", "feedback",
        "rejected", "seen", "score", "hint", "status", "trace",
    )  # fmt: skip

    def __init__(self, i: int, row: dict, settings: dict) -> None:
        self.i = i
        self.row = row
        self.pid = row["problem_id"]
        domain = row.get("domain") or "math"
        self.max_retry, self.max_refine, self.threshold, limits = settings[domain] if domain in settings else settings["math"]
        self.ctx = RuleContext(
            domain=domain,
            answer=row.get("label"),
            problem=row.get("problem") or "",
            previous_hints=tuple(row.get("previous_hints") or ()),
            limits=limits,
        )
        self.keywords: list[str] = []
        self.error: str | None = None
        self.phase = ATTR
        self.retry = self.refine = self.refines = self.cand_no = 0
        self.candidate: str | None = None
        self.last_violations: list[str] = []
        self.feedback: str | None = None
        self.rejected: list[str] = []
        self.seen: dict[str, None] = {}  # ordered set of violation names
        self.score: float | None = None
        self.hint = ""
        self.status = ""
        self.trace: list[tuple] = []


class _Shard:
    """The per-shard machinery: templates, schemas and the state transitions."""

    def __init__(self, cfg: HintConfig, templates: agents.Templates, stats: HintStats) -> None:
        self.cfg = cfg
        self.t = templates
        self.st = stats
        self.attr_schema = agents.attribution_schema(cfg.max_keywords, cfg.keyword_chars, cfg.error_chars)
        self.hint_schemas: dict[int, dict] = {}
        self.judge_schema = agents.judgment_schema(cfg.feedback_chars, cfg.judge_correctness)
        self.attr_instructions = Instructions.of(templates.texts["attribution_system"], templates.texts["attribution_user"])
        self.seed_prefix = f"{cfg.seed}|"

    def _seed(self, p: _Problem, agent: str, n: int) -> int:
        return zlib.crc32(f"{self.seed_prefix}{p.pid}|{agent}|{n}".encode()) & 0x7FFFFFFF

    def _hint_schema(self, p: _Problem) -> dict:
        n = p.ctx.limits.max_chars
        s = self.hint_schemas.get(n)
        if s is None:
            s = self.hint_schemas[n] = agents.hint_schema(n, self.cfg.reasoning_chars)
        return s

    # ------------------------------------------------------------------ requests

    def request(self, p: _Problem) -> GenRequest:
        cfg, t, phase = self.cfg, self.t, p.phase
        agent = AGENT[phase]
        if phase == ATTR:
            msgs = agents.attribution_messages(p.row, t, cfg.max_failed, cfg.failed_chars)
            return GenRequest(f"{p.i}:{agent}:0", msgs, cfg.max_tokens.attribution, cfg.analysis_temperature, 1.0,
                              self._seed(p, agent, 0), self.attr_schema)
        if phase == GEN:
            msgs = agents.generation_messages(p.row, p.keywords, p.error, t, p.rejected if p.retry else None,
                                              diagnosis=cfg.attribution)
            return GenRequest(f"{p.i}:{agent}:{p.cand_no}", msgs, cfg.max_tokens.generation, cfg.temperature, cfg.top_p,
                              self._seed(p, agent, p.cand_no), self._hint_schema(p))
        if phase == JUDGE:
            msgs = agents.judgment_messages(p.row, p.candidate or "", t)
            n = p.cand_no - 1
            return GenRequest(f"{p.i}:{agent}:{n}", msgs, cfg.max_tokens.judgment, cfg.analysis_temperature, 1.0,
                              self._seed(p, agent, n), self.judge_schema)
        msgs = agents.repair_messages(p.row, p.candidate or "", p.last_violations, p.feedback, t)
        return GenRequest(f"{p.i}:{agent}:{p.cand_no}", msgs, cfg.max_tokens.repair, cfg.temperature, cfg.top_p,
                          self._seed(p, agent, p.cand_no), self._hint_schema(p))

    # ------------------------------------------------------------------ results

    def consume(self, p: _Problem, res: GenResult) -> None:
        st, phase = self.st, p.phase
        agent = AGENT[phase]
        st.requests_by_agent[agent] += 1
        truncated = res.finish_reason == "length"
        if truncated:
            st.truncated[agent] += 1
        if phase == ATTR:
            parsed = agents.parse_attribution(res.text, p.row, self.cfg.max_keywords, self.cfg.keyword_chars, self.cfg.error_chars)
            self._trace(p, agent, 0, res, parsed)
            if parsed is None:
                st.parse_failures[agent] += 1
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
            if self.cfg.generation:
                p.phase = GEN
            else:
                self._fallback(p)  # no Generation agent: the keyword template (or the generic hint)
            return
        if phase == JUDGE:
            st.judge_calls += 1
            parsed = agents.parse_judgment(res.text, p.row, self.cfg.feedback_chars)
            self._trace(p, agent, p.cand_no - 1, res, parsed)
            if parsed is None:
                st.parse_failures[agent] += 1
                self._reject(p, ["judge_parse_error"], None)
                return
            p.score = parsed["score"]
            if parsed.get("correct") is False:
                self._reject(p, ["judge_incorrect"], parsed["feedback"])
            elif p.score >= p.threshold:
                self._accept(p)
            else:
                self._reject(p, ["judge_low_score"], parsed["feedback"])
            return
        # generation or repair: a new candidate
        parsed = agents.parse_hint(res.text, p.row)
        n = p.cand_no
        p.cand_no += 1
        self._trace(p, agent, n, res, parsed)
        if parsed is None:
            st.parse_failures[agent] += 1
            self._reject(p, ["parse_error", "truncated"] if truncated else ["parse_error"], None)
            return
        hint = parsed["hint"]
        p.candidate = hint
        violations = check_hint(hint, p.ctx)
        p.trace.append(("rules", n, hint, _to_json({"ok": not violations, "violations": violations}) if violations else _RULES_OK,
                        None, 0, 0))
        if violations:
            self._reject(p, violations, None)
        elif self.cfg.llm_judge:
            p.phase = JUDGE
        else:
            self._accept(p)

    def _trace(self, p: _Problem, agent: str, n: int, res: GenResult, parsed: dict | None) -> None:
        p.trace.append((agent, n, res.text, None if parsed is None else _to_json(parsed),
                        res.finish_reason, res.prompt_tokens, res.completion_tokens))

    def _reject(self, p: _Problem, violations: list[str], feedback: str | None) -> None:
        for v in violations:
            self.st.violations[v] += 1
            p.seen[v] = None
        p.last_violations = violations
        p.feedback = feedback
        if p.candidate is not None and p.refine < p.max_refine:
            p.refine += 1
            p.refines += 1
            p.phase = REPAIR
        elif p.retry < p.max_retry:
            p.retry += 1
            p.refine = 0
            p.candidate = None
            p.score = None
            p.rejected = [v for v in violations if v not in ("parse_error", "truncated")] or violations
            p.phase = GEN
        else:
            self._fallback(p)

    def _accept(self, p: _Problem) -> None:
        p.hint = p.candidate or ""
        p.status = "accepted" if p.retry == 0 and p.refines == 0 else "repaired"
        p.phase = DONE

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
        p.phase = DONE
        p.trace.append(("fallback", p.cand_no, chosen[1], json.dumps({"source": chosen[0], "rejected": rejected}), None, 0, 0))


def hint_shard(
    rows: Sequence[dict] | pa.Table,
    cfg: HintConfig,
    backend: Backend,
    stats: HintStats | None = None,
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
    settings = {d: cfg.for_domain(d) for d in ("math", "code")}
    problems = [_Problem(i, row, settings) for i, row in enumerate(rows)]
    if not cfg.attribution:
        for p in problems:
            if cfg.generation:
                p.phase = GEN
            else:
                shard._fallback(p)  # neither agent: the generic default hint, no engine call
    calls0, pt0, ct0, = backend.calls, backend.prompt_tokens, backend.completion_tokens
    pending = [p for p in problems if p.phase != DONE]
    request, consume = shard.request, shard.consume
    while pending:
        t0 = time.perf_counter()
        results = backend.generate([request(p) for p in pending])
        st.waves += 1
        if log.isEnabledFor(logging.INFO):
            agents_in_wave = Counter(AGENT[p.phase] for p in pending)
            log.info("wave %d: %d requests %s in %.1f s", st.waves, len(pending), dict(agents_in_wave), time.perf_counter() - t0)
        st.requests += len(pending)
        nxt = []
        for p, res in zip(pending, results):
            consume(p, res)
            if p.phase != DONE:
                nxt.append(p)
        if progress is not None:
            progress(len(pending) - len(nxt), st.waves)
        pending = nxt
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
    """Columns built directly (no per-row dicts): the trace is one flat struct array with offsets."""
    n = len(problems)
    offsets = [0]
    flat: list[tuple] = []
    for p in problems:
        flat.extend(p.trace)
        offsets.append(len(flat))
    cols = list(zip(*flat)) if flat else [()] * TRACE_ENTRY.num_fields  # transpose in C
    struct_types = [TRACE_ENTRY.field(i).type for i in range(TRACE_ENTRY.num_fields)]
    entries = pa.StructArray.from_arrays(
        [pa.array(c, type=ty) for c, ty in zip(cols, struct_types)],
        fields=list(TRACE_ENTRY),
    )
    trace = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), entries)
    hints = [p.hint for p in problems]
    pids = [p.pid for p in problems]
    arrays = {
        "problem_id": pa.array(pids, pa.string()),
        "round": pa.array([int(p.row.get("round") or 0) for p in problems], pa.int32()),
        "hint_id": pa.array([content_hash(pid, h) for pid, h in zip(pids, hints)], pa.string()),
        "hint": pa.array(hints, pa.string()),
        "keywords": pa.array([p.keywords for p in problems], pa.list_(pa.string())),
        "error": pa.array([p.error for p in problems], pa.string()),
        "status": pa.array([p.status for p in problems], pa.string()),
        "retries": pa.array([p.retry for p in problems], pa.int32()),
        "refines": pa.array([p.refines for p in problems], pa.int32()),
        "judge_score": pa.array([p.score for p in problems], pa.float64()),
        "violations": pa.array([list(p.seen) for p in problems], pa.list_(pa.string())),
        "trace": trace,
        "model": pa.array([model] * n, pa.string()),
        "prompt_version": pa.array([prompt_version] * n, pa.string()),
        "config_hash": pa.array([cfg_hash] * n, pa.string()),
    }
    schema = pa.schema(list(HINTS), metadata=schema_metadata("hints"))
    return pa.Table.from_arrays([arrays[f.name].cast(f.type) if not arrays[f.name].type.equals(f.type) else arrays[f.name] for f in HINTS], schema=schema)


# --------------------------------------------------------------------------- shards on disk

MapFn = Callable[..., list]


def serial_map(fn: Callable, items: list, *args) -> list:
    return [fn(item, *args) for item in items]


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
    done, shard = Path(task.done_path), Path(task.shard_path)
    if done.is_file() and shard.is_file():
        try:
            marker = json.loads(done.read_text())
        except ValueError:
            return None
        if marker.get("key") == task.key:
            return marker
    return None


def run_shard(task: ShardTask, cfg: HintConfig, backend_factory: Callable[[], Backend],
              progress: Callable[[int, int], None] | None = None) -> dict:
    """Hint one shard and write it (parquet first, then the done marker). Top-level: picklable for dask."""
    from mentor.pipeline.io import write_json_atomic, write_parquet_atomic

    marker = shard_done(task)
    if marker is not None:  # e.g. a dask task retried after its worker died past the write
        return {"stats": marker["stats"], "reused": True}
    st = HintStats()
    try:
        table = hint_shard(task.rows, cfg, backend_factory(), stats=st, progress=progress)
    except EngineError as exc:
        first = task.rows[0]["problem_id"] if task.rows else "-"
        raise EngineError(
            f"hint: shard {task.index + 1} of {task.total} ({len(task.rows)} problems from {first}) failed after "
            f"{st.waves} waves: {exc}. Finished shards are kept: rerun the same command to redo only the unfinished ones"
        ) from exc
    write_parquet_atomic(table, task.shard_path, dataset="hints")
    stats = st.as_dict()
    write_json_atomic({"key": task.key, "index": task.index, "rows": table.num_rows, "stats": stats}, task.done_path)
    from mentor.pipeline.faults import fault_point

    fault_point("hint.after_shard")
    return {"stats": stats, "reused": False}


def input_hash(rows: list[dict]) -> str:
    blob = json.dumps(rows, sort_keys=True, ensure_ascii=False, default=str)
    return content_hash(blob, length=24)


def describe_factory(factory: Callable[[], Backend]) -> Any:
    if hasattr(factory, "describe"):
        return factory.describe()
    return {"factory": getattr(factory, "__qualname__", type(factory).__name__)}


def hint_to_dir(
    collapsed_path: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    cfg: HintConfig,
    backend_factory: Callable[[], Backend],
    map_fn: MapFn = serial_map,
    sample: int | None = None,
    progress: bool = False,
) -> HintStats:
    """Hint a collapsed dataset into ``out_dir/hints.parquet`` and ``out_dir/stats.json``.

    Shards live in ``out_dir/_shards/<key>.parquet`` with ``<key>.done.json``
    beside them; `key` hashes the shard's rows, the config, the prompt
    version and the backend description, so finished shards are reused and
    any change recomputes exactly what it affects.
    """
    from tqdm.auto import tqdm

    from mentor.pipeline.io import config_hash, read_table, resolve_inputs, write_json_atomic, write_parquet_atomic

    sources = [collapsed_path] if isinstance(collapsed_path, (str, Path)) else list(collapsed_path)
    paths = resolve_inputs(sources)
    table = read_table(paths, "collapsed").sort_by("problem_id")
    if sample is not None:
        if sample < 1:
            raise ConfigError(f"--sample must be >= 1, got {sample}")
        table = table.slice(0, sample)
    rows = table.to_pylist()
    templates = agents.Templates.load(cfg.templates_dir)
    run_key = config_hash(
        {"hint": cfg.semantic(), "prompt_version": templates.version, "backend": describe_factory(backend_factory),
         "schema": SCHEMA_VERSION}
    )
    out_dir = Path(out_dir)
    shard_dir = out_dir / "_shards"
    tasks: list[ShardTask] = []
    for index, start in enumerate(range(0, len(rows), cfg.shard_size)):
        chunk = rows[start : start + cfg.shard_size]
        key = content_hash(run_key, input_hash(chunk), length=24)
        tasks.append(ShardTask(index, key, chunk, str(shard_dir / f"{key}.parquet"), str(shard_dir / f"{key}.done.json"),
                               total=-(-len(rows) // cfg.shard_size)))
    todo = [t for t in tasks if shard_done(t) is None]
    stats = HintStats()
    todo_ids = {t.index for t in todo}
    reused = [t for t in tasks if t.index not in todo_ids]
    for t in reused:
        stats.add(shard_done(t)["stats"])  # type: ignore[index]
    bar = tqdm(total=len(rows), desc="hint", unit="problem", disable=not progress, dynamic_ncols=True)
    bar.update(sum(len(t.rows) for t in reused))
    run_calls = 0
    try:
        if todo and map_fn is serial_map:
            def tick(n: int, wave: int) -> None:
                bar.update(n)
                bar.set_postfix(wave=wave, refresh=False)

            results = [run_shard(t, cfg, backend_factory, tick) for t in todo]
        elif todo:
            results = map_fn(run_shard, todo, cfg, backend_factory)
            bar.update(sum(len(t.rows) for t in todo))
        else:
            results = []
    finally:
        bar.close()
    for r in results:
        stats.add(r["stats"])
        if not r["reused"]:
            run_calls += r["stats"]["engine_calls"]
    import pyarrow.parquet as pq

    parts = [pq.read_table(t.shard_path) for t in tasks]
    hints = pa.concat_tables(parts) if parts else HINTS.empty_table()
    write_parquet_atomic(hints, out_dir / "hints.parquet", dataset="hints")
    summary = stats.as_dict() | {
        "this_run": {
            "engine_calls": run_calls,
            "shards_computed": sum(1 for r in results if not r["reused"]),
            "shards_reused": len(tasks) - sum(1 for r in results if not r["reused"]),
        },
        "prompt_version": templates.version,
        "backend": describe_factory(backend_factory),
        "config": cfg.model_dump(mode="json"),
        "inputs": [str(p) for p in paths],
        "sample": sample,
    }
    write_json_atomic(summary, out_dir / "stats.json")
    log.info("hinted %d problems: %d accepted, %d repaired, %d fallback, %d engine calls",
             stats.problems, stats.accepted, stats.repaired, stats.fallback, stats.engine_calls)
    return stats
