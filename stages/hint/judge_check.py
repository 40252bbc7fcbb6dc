"""The judge check: score the LLM judge on hints whose verdict is known before trusting it.

A small judge (the 1.5B said "incorrect" to 1,244 of 1,317 hints; the 0.5B gave
8.0 to every hint) makes the hint stage spend every repair and regeneration on a
coin flip. So at the start of a hint run with the LLM judge on (and in
``mentor check-judge``) the judge first reviews a *calibration set* built from the
run's own collapsed problems:

- ``good``: the reference solution's first step ("A first step: Janet sells
  16 - 3 - 4 = 9 duck eggs a day."), only where a reference solution is known
  and the hint passes the rules;
- ``number_changed``: the same hint with its last number changed (a false step);
- ``answer_in_words``: a hint that states the answer in words;
- ``restatement``: the problem's own opening sentences given back as the hint.

Each item is one request of the *same* judgment agent as the real run (its
messages, JSON schema, sampling, token limit and parser: `stages.hint`'s
`HintMachine.judgment_request` builds them), all in ONE backend call, and each verdict is read as the
run reads it: accepted when not judged incorrect and the score reaches the
domain's ``judge_threshold``. The judge's discrimination is the balanced
accuracy over good (should accept) and bad (should reject) items. Below
``min_balanced_accuracy`` the judge cannot tell them apart: the stage says so
in one line and (``on_fail: rules_only``, the default) runs with
``llm_judge: false`` -- the rules, the trim and rule-driven repairs alone.

Reference solutions: a ``solution`` key on the collapsed row, else the
``solutions`` file (Parquet / JSONL with ``problem_id`` and ``solution``), else
the bundled solutions (GSM8K, MATH-500, HumanEval; `stages.solutions`, by problem id).
The judge sees the solution as a run's judge does (``see_solution``).
Solutions in GSM8K's format (steps on lines, ``<<calc>>`` notes, ``#### N``) or
plain text (the first sentence is the first step). Without any, the judge is
left unchecked and the stage says so.

The result is written to ``DIR/judge_check.json`` (every verdict, with the raw
text) keyed by the calibration set, the hint settings, the prompt version and
the backend, so a rerun of the same run reuses it and starts no engine.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mentor.pipeline.errors import ConfigError, DataError, EngineError
from mentor.pipeline.executor import LOCAL, Executor
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import config_hash, read_table, write_json_atomic
from mentor.pipeline.llm import Backend, GenRequest, GenResult
from mentor.stages.hint.agents import by_role
from mentor.stages.hint.prompt_templates import Templates
from mentor.stages.hint.config import HintConfig
from mentor.stages.hint.machine import HintMachine, HintStats
from mentor.stages.rules import RuleContext, RuleRegistry, check_hint
from mentor.stages.solutions import load_solutions, with_solutions

log = logging.getLogger(__name__)

KINDS = ("good", "number_changed", "answer_in_words", "restatement")
BAD_KINDS = KINDS[1:]
RESULT_FILE = "judge_check.json"


@dataclass(frozen=True)
class CalibrationItem:
    """One hint whose verdict is known: `expected` True = the judge should accept it."""

    problem_id: str
    kind: str  # one of KINDS
    hint: str

    @property
    def expected(self) -> bool:
        return self.kind == "good"


# --------------------------------------------------------------------------- reference solutions


_CALC = re.compile(r"<<[^>]*>>")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def first_step(solution: str) -> str | None:
    """The first step of a worked solution: GSM8K's first line without ``<<calc>>`` notes, else the first sentence."""
    lines = [ln.strip() for ln in _CALC.sub("", solution or "").splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("####")]
    if not lines:
        return None
    if len(lines) == 1:
        lines = [s for s in _SENTENCE.split(lines[0]) if s.strip()]
    step = " ".join(lines[0].split())
    return step or None


def good_candidates(solution: str) -> list[str]:
    """Known-good hints from a reference solution, strongest first (the step, then the step without its result)."""
    step = first_step(solution)
    if not step:
        return []
    out = [f"A first step: {step}"]
    if "=" in step:
        out.append(f"A first step: {step.rsplit('=', 1)[0].strip()}.")
    return out


# --------------------------------------------------------------------------- bad hints

_NUM = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w])")


def change_a_number(hint: str, answer: str | None) -> str | None:
    """`hint` with its last number changed (a result made false), never into the answer; None without a number."""
    nums = list(_NUM.finditer(hint))
    if not nums:
        return None
    m = nums[-1]
    text = m.group(1)
    value = float(text) if "." in text else int(text)
    for bump in (2, 3, 5, 7):
        new = value + bump if value < 10 else value + max(bump, round(value * 0.25 * bump / 2))
        new_text = f"{new:g}" if isinstance(new, float) else str(new)
        if answer is None or new_text.strip() != str(answer).strip().replace(",", ""):
            return hint[: m.start()] + new_text + hint[m.end():]
    return None


_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
        "seventeen eighteen nineteen".split()
_TENS_W = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def int_words(n: int) -> str:
    """English words of a non-negative integer (``18`` -> ``eighteen``, ``9360`` -> ``nine thousand three hundred sixty``)."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS_W[n // 10 - 2] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    if n < 1000:
        return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + int_words(n % 100))
    for scale, word in ((10**9, "billion"), (10**6, "million"), (10**3, "thousand")):
        if n >= scale:
            return int_words(n // scale) + " " + word + ("" if n % scale == 0 else " " + int_words(n % scale))
    return str(n)  # pragma: no cover - unreachable


def answer_in_words(answer: str | None) -> str | None:
    a = (answer or "").strip().replace(",", "").lstrip("$")
    if re.fullmatch(r"-?\d+", a) and abs(int(a)) < 10**12:
        words = int_words(abs(int(a)))
        words = ("minus " + words) if a.startswith("-") else words
        return f"Work through the quantities step by step and you will find that the result is {words}."
    if a:
        return f"Work through the quantities step by step and you will find that the result is {a}."
    return None


def restatement(problem: str, max_chars: int) -> str | None:
    """The problem's opening sentences, as long as they fit the hint length limit."""
    sents = [s.strip() for s in _SENTENCE.split(" ".join(problem.split())) if s.strip()]
    out = ""
    for s in sents:
        nxt = f"{out} {s}".strip()
        if len(nxt) > max_chars:
            break
        out = nxt
    return out or None


# --------------------------------------------------------------------------- the calibration set


def rule_context(row: dict, cfg: HintConfig) -> RuleContext:
    return RuleContext.of_row(row, cfg.for_domain(row.get("domain") or "math")[3])


def calibration_set(rows: Sequence[dict], cfg: HintConfig, solutions: dict[str, str]) -> list[CalibrationItem]:
    """Up to ``cfg.judge_check.problems`` problems (in row order) with a reference step that passes the rules,
    each giving one good item and its bad siblings."""
    items: list[CalibrationItem] = []
    used = 0
    seen: set[str] = set()
    for row in rows:
        if used >= cfg.judge_check.problems:
            break
        pid = row["problem_id"]
        if pid in seen or (row.get("domain") or "math") != "math":
            continue
        seen.add(pid)
        solution = row.get("solution") or solutions.get(pid)
        if not solution:
            continue
        ctx = rule_context(row, cfg)
        good = next((h for h in good_candidates(solution) if not check_hint(h, ctx)), None)
        if good is None:
            continue
        used += 1
        items.append(CalibrationItem(pid, "good", good))
        for kind, hint in (("number_changed", change_a_number(good, row.get("label"))),
                           ("answer_in_words", answer_in_words(row.get("label"))),
                           ("restatement", restatement(row.get("problem") or "", ctx.limits.max_chars))):
            if hint and hint != good:
                items.append(CalibrationItem(pid, kind, hint))
    return items


# --------------------------------------------------------------------------- the judge on it


def judge_requests(items: Sequence[CalibrationItem], rows: dict[str, dict], cfg: HintConfig,
                   templates: Templates) -> list[GenRequest]:
    """The run's own judgment requests (messages, schema, sampling, max_tokens, seed scheme) for each item."""
    machine = HintMachine(cfg, templates, HintStats())
    return [machine.judgment_request(i, rows[it.problem_id], it.hint) for i, it in enumerate(items)]


def accepts(parsed: dict | None, threshold: float) -> bool:
    """The run's verdict (the judgment agent's `consume`): it parsed and no verdict rule fires (`RuleRegistry.verdicts`:
    not judged incorrect, and the score reaches the threshold)."""
    return parsed is not None and not any(v.check(parsed, threshold) for v in RuleRegistry.verdicts())


def score(items: Sequence[CalibrationItem], results: Sequence[GenResult], rows: dict[str, dict], cfg: HintConfig) -> dict:
    """Verdicts, counts and balanced accuracy of the judge on the calibration set."""
    verdicts = []
    counts = {k: Counter() for k in KINDS}
    parse_failures = 0
    for it, res in zip(items, results):
        row = rows[it.problem_id]
        parsed = by_role("review")[0].parse(res.text, cfg)
        threshold = cfg.for_domain(row.get("domain") or "math")[2]
        ok = accepts(parsed, threshold)
        parse_failures += parsed is None
        counts[it.kind]["accepted" if ok else "rejected"] += 1
        verdicts.append(asdict(it) | {"expected": "accept" if it.expected else "reject", "accepted": ok,
                                      "correct": None if parsed is None else parsed.get("correct"),
                                      "score": None if parsed is None else parsed["score"],
                                      "raw": res.text, "finish_reason": res.finish_reason})
    good_n = sum(counts["good"].values())
    bad_n = sum(sum(counts[k].values()) for k in BAD_KINDS)
    tpr = counts["good"]["accepted"] / good_n if good_n else None
    tnr = sum(counts[k]["rejected"] for k in BAD_KINDS) / bad_n if bad_n else None
    ba = (tpr + tnr) / 2 if tpr is not None and tnr is not None else None
    return {
        "items": len(items),
        "problems": len({it.problem_id for it in items}),
        "good": {"n": good_n, "accepted": counts["good"]["accepted"]},
        "bad": {"n": bad_n, "rejected": sum(counts[k]["rejected"] for k in BAD_KINDS),
                "by_kind": {k: {"n": sum(counts[k].values()), "rejected": counts[k]["rejected"]} for k in BAD_KINDS}},
        "good_accepted_rate": None if tpr is None else round(tpr, 4),
        "bad_rejected_rate": None if tnr is None else round(tnr, 4),
        "balanced_accuracy": None if ba is None else round(ba, 4),
        "parse_failures": parse_failures,
        "verdicts": verdicts,
    }


def check_judge(rows: Sequence[dict], cfg: HintConfig, backend: Backend, templates: Templates | None = None,
                solutions: dict[str, str] | None = None) -> dict:
    """The judge check on `rows` (collapsed rows) with `backend`: one engine call; the report (see `decide`)."""
    t = templates or Templates.load(cfg.templates_dir)
    sols = load_solutions(cfg.judge_check.solutions or cfg.solutions) if solutions is None else solutions
    if cfg.see_solution:  # the judge reviews with the reference solution in view, as in the run
        rows = with_solutions(list(rows), sols)
    items = calibration_set(rows, cfg, sols)
    if not items:
        return {"status": "unchecked", "reason": "no collapsed math problem has a reference solution whose first step "
                "passes the rules (judge_check.solutions gives them)", "items": 0}
    by_id = {r["problem_id"]: r for r in rows}
    calls0, pt0, ct0 = backend.calls, backend.prompt_tokens, backend.completion_tokens
    results = backend.generate(judge_requests(items, by_id, cfg, t))
    report = score(items, results, by_id, cfg)
    report |= {"engine_calls": backend.calls - calls0, "prompt_tokens": backend.prompt_tokens - pt0,
               "completion_tokens": backend.completion_tokens - ct0, "model": getattr(backend, "model", "unknown")}
    return decide(report, cfg)


def decide(report: dict, cfg: HintConfig) -> dict:
    """Add ``status`` (trusted | untrusted), ``threshold`` and ``action`` (judge | rules_only) to a scored report."""
    jc = cfg.judge_check
    ba = report.get("balanced_accuracy")
    trusted = ba is not None and ba >= jc.min_balanced_accuracy
    report["threshold"] = jc.min_balanced_accuracy
    report["status"] = "trusted" if trusted else "untrusted"
    report["action"] = "judge" if trusted or jc.on_fail != "rules_only" else "rules_only"
    return report


def summary_line(report: dict, run: bool = True) -> str:
    """One line for the log (`run`) or for `mentor check-judge`'s stderr."""
    if report["status"] == "unchecked":
        return f"judge check: not run ({report['reason']}); the LLM judge is used unchecked"
    g, b = report["good"], report["bad"]
    head = (f"judge check: balanced accuracy {report['balanced_accuracy']} on {report['items']} calibration hints "
            f"(accepted {g['accepted']}/{g['n']} good, rejected {b['rejected']}/{b['n']} bad; "
            f"threshold {report['threshold']})")
    if report["status"] == "trusted":
        return head + ": the judge is trusted"
    if report["action"] == "rules_only":
        what = "this run judges" if run else "a hint run with these settings would judge"
        return head + f": it cannot tell good hints from bad, so {what} by the rules alone (judge_check.on_fail)"
    return head + ": it cannot tell good hints from bad; kept anyway (judge_check.on_fail: keep_judge)"


# --------------------------------------------------------------------------- within a hint run


def leading_rows(table: Any, cfg: HintConfig, solutions: dict[str, str], batch: int = 256) -> list[dict]:
    """The first rows of a collapsed table (pyarrow), read a batch at a time until they make the calibration set."""
    rows: list[dict] = []
    for start in range(0, table.num_rows, batch):
        rows.extend(table.slice(start, batch).to_pylist())
        if len({it.problem_id for it in calibration_set(rows, cfg, solutions)}) >= cfg.judge_check.problems:
            break
    return rows


@dataclass
class CheckTask:
    """The calibration of one run, small enough to ship to a dask worker (which owns the engine)."""

    rows: list[dict]
    solutions: dict[str, str]


def run_check(task: CheckTask, cfg: HintConfig, backend_factory: Callable[[], Backend]) -> dict:
    """Top-level (picklable): the judge check on the worker that owns the engine."""
    return check_judge(task.rows, cfg, backend_factory(), solutions=task.solutions)


def checked_config(cfg: HintConfig, rows: Any, out_dir: str | Path, templates: Templates,
                   backend_factory: Callable[[], Backend], executor: Executor = LOCAL,
                   describe: Callable[[Any], Any] | None = None) -> tuple[HintConfig, dict | None]:
    """The config a hint run uses after the judge check, and the check's report (None: not run).

    Reuses ``out_dir/judge_check.json`` when its key matches; writes it otherwise.
    """
    if not (cfg.llm_judge and cfg.judge_check.enabled):
        return cfg, None

    solutions = load_solutions(cfg.judge_check.solutions or cfg.solutions)
    if hasattr(rows, "slice"):  # a pyarrow table (a whole collapsed set)
        rows = leading_rows(rows, cfg, solutions)
    items = calibration_set(rows, cfg, solutions)
    used = {it.problem_id for it in items}
    key = config_hash({"items": [asdict(it) for it in items], "hint": cfg.semantic(),
                       "judge_check": cfg.judge_check.model_dump(mode="json", exclude={"solutions"}),
                       "prompt_version": templates.version,
                       "backend": describe(backend_factory) if describe else repr(backend_factory)})
    path = Path(out_dir) / RESULT_FILE
    report = _read_cached(path, key)
    reused = report is not None
    if report is None and not items:  # nothing to check with: no engine is started for it
        report = {"status": "unchecked", "items": 0, "reason": "no collapsed math problem has a reference solution "
                  "whose first step passes the rules (judge_check.solutions gives them)"}
    if report is None:
        task = CheckTask([r for r in rows if r["problem_id"] in used], {p: solutions[p] for p in used if p in solutions})
        try:
            (report,) = executor.map(run_check, [task], cfg, backend_factory)
        except EngineError as exc:
            raise EngineError(f"hint: the judge check ({len(items)} calibration hints from {len(used)} problems) failed "
                              f"before any shard ran: {exc}. Rerun the same command (judge_check.enabled: false skips "
                              "the check)") from exc
        write_json_atomic({"key": key, "report": report}, path)
    report = dict(report, reused=reused)
    line = summary_line(report)
    if report["status"] != "trusted":
        if report["status"] == "untrusted" and cfg.judge_check.on_fail == "error":
            raise ConfigError(line.replace(": it cannot", ": the judge cannot") + "; stopping (judge_check.on_fail: error)")
        log.warning(line)
    else:
        log.info(line)
    if report.get("action") == "rules_only":
        return cfg.model_copy(update={"llm_judge": False}), report
    return cfg, report


def _read_cached(path: Path, key: str) -> dict | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj.get("report") if isinstance(obj, dict) and obj.get("key") == key else None


def stats_view(report: dict | None) -> dict | None:
    """The report without its verdicts (what goes into stats.json and `mentor inspect`)."""
    if report is None:
        return None
    return {k: v for k, v in report.items() if k != "verdicts"}


def check_judge_path(collapsed: Sequence[str], cfg: HintConfig, backend_factory: Callable[[], Backend],
                     out: str | Path | None = None) -> dict:
    """`mentor check-judge`: the judge check on a collapsed dataset (problem_id order); the full report.

    A dataset with no problem to build the calibration set from is an error (there is nothing to check).
    `out` gets the report with every verdict (JSON, atomically).
    """

    paths = resolve_inputs(list(collapsed))
    table = read_table(paths, "collapsed").sort_by("problem_id")
    solutions = load_solutions(cfg.judge_check.solutions or cfg.solutions)
    rows = leading_rows(table, cfg, solutions)
    items = calibration_set(rows, cfg, solutions)
    if not items:
        where = ", ".join(map(str, paths))
        source = cfg.judge_check.solutions or "the bundled GSM8K solutions"
        raise DataError(f"{where}: none of its {table.num_rows} collapsed problems has a reference solution in {source} "
                        "whose first step passes the rules, so there is nothing to check the judge with; pass "
                        "--solutions FILE (Parquet or JSONL with problem_id and solution)")
    used = {it.problem_id for it in items}
    report = check_judge([r for r in rows if r["problem_id"] in used], cfg, backend_factory(), solutions=solutions)
    report["inputs"] = [str(p) for p in paths]
    if out is not None:
        write_json_atomic(report, out)
    return report


__all__ = ["CalibrationItem", "calibration_set", "check_judge", "check_judge_path", "checked_config",
           "decide", "load_solutions", "stats_view", "summary_line"]
