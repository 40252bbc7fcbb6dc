"""Does mentor rescue collapsed problems? A paired benchmark of the hint stage and its ablations.

    python tests/benchmarks/bench_rescue.py [--domain math|code] [--policy MODEL] [--hinter MODEL]
        [--problems N] [--screen-k 8] [--k 4] [--seed 0] [--split dev|report|all] [--quick]
        [--placements after assistant ...] [--placement P] [--gate control_half|control_first_step|control_answer|off]
        [--controls control_first_step control_half] [--wordings bare labelled first_person after]
        [--collapsed FILE] [--controls-only] [--offset N --rows N] [--screen-only] [--hints-only]

1. Screen: roll out the policy on the problems of the split (GSM8K test for
   math, HumanEval for code) with ``--screen-k`` samples (default 8, i.e. two
   independent draws of k=4) and mine the problems that got none right
   (`mentor rollout` + `mentor mine`). Problems collapsed at k=4 by sampling
   noise alone mostly come back on a second draw; 0/8 keeps the ones this
   policy fails systematically (what consecutive collapsed rounds select).
   ``--collapsed FILE`` takes a collapsed set instead (no screen).
2. Controls. Hints no pipeline could give, from the reference solution:
   ``control_first_step`` (its first step: about what a good hint says),
   ``control_half`` (the first half of its steps) and ``control_answer`` (all of
   it and "The answer is N.": the uptake ceiling); and ``neutral``, filler text
   of the first step's length in the same place (neutral text alone "rescues"
   some all-zero groups, as LoPE found: a hint must beat it, not only no hint).
   With ``--gate`` on, they are first re-rolled with ``unhinted`` under each of
   ``--placements`` in one `mentor rescue` run; one ``setting`` line per
   placement gives the uptake and whether the gate control beats both unhinted
   and neutral on the per-problem endpoint; no placement separating: "cannot show
   a hint effect", and the run stops before any hinting.
3. Hint the collapsed set under each arm, through `mentor hint` and its config:
   ``full`` (Attribution -> Generation -> Judgment -> Repair, the defaults: the
   agents see the reference solution, the judge checked first:
   stages/hint/judge_check.py), ``vouched`` (``full`` plus ``vouch:``: the policy
   re-rolls each candidate hint and the first that earns reward is kept,
   stages/hint/vouch.py; its re-roll seeds avoid the rescue's), ``no_attribution``
   (``attribution: false``: generation from the problem alone), ``no_judgment``
   (``llm_judge: false, max_refine: 0``: the first generated hint that passes the
   rule checks), ``no_generation`` (``generation: false``: the keyword template;
   opt-in), ``generic`` (``attribution: false, generation: false, llm_judge:
   false``: the safe default hint, no engine), and ``reference`` (the reference
   solution's first step, leak-checked by the rules; else its first step cut
   before the result; else the generic hint).
4. Re-roll every collapsed problem k times in ONE `mentor rescue` run: ``unhinted``,
   ``neutral``, the ``--controls`` and every hint arm (``--wordings``: each hint arm
   once per opening of the answer or placement): same problems, same seeds, one
   engine batch per shard (on CPU, batch composition changes the numerics, so
   arms are only compared within one run). The hint goes where the controls
   separated best, else ``--placement``, else ``assistant`` (the start of the
   policy's answer, rendered with its chat template) for a vllm policy on math
   and ``after`` on code (where text opening the answer is explained, not used).

One JSON line per arm: rescue rate (problems with >= 1 correct re-roll) with a
95% Wilson interval, mean correctness of the re-rolls, hint-engine tokens per
problem (the judge check's included), hints failing `check-hint`, and paired
comparisons with ``unhinted``, ``neutral`` and ``generic``: the rescued-or-not
difference (95% paired-bootstrap interval, exact McNemar p) and the per-problem
endpoint (each problem's mean correctness under the arm minus under the other
arm: mean, 95% paired-bootstrap interval, Wilcoxon signed-rank p), which needs
about a quarter of the problems for the same interval. The ``done`` line says
whether a control beats both unhinted and neutral in this run. A PNG bar chart
beside the outputs. Progress bars on stderr (``--no-progress``).

Splits: dev = even positions of the problem set, report = odd positions, all =
both. Tune on dev, report on report. Every step is a resumable mentor stage
under ``--work`` (default: bench/rescue in the mentor cache, ~/.cache/mentor;
never inside the repository): rerunning after a change recomputes only what it affects.
Needs ../shared/data (MENTOR_SHARED_DATA) for the reference solutions.
Over 500 lines so that the experiment (screen, controls, arms, report) reads top to bottom in one file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import signal
import sys
import time
from math import comb, erf
from pathlib import Path

ARMS = ("generic", "full", "vouched", "no_attribution", "no_judgment", "no_generation", "reference")
DEFAULT_ARMS = ("generic", "full", "vouched", "no_attribution", "no_judgment", "reference")
QUICK_ARMS = ("generic", "full", "reference")  # vouched (opt-in in the method) costs 3x full: --arms adds it
QUICK_PROBLEMS = 48
# HintConfig overrides per arm (on top of the --hint-config file, if any).
ARM_CONFIG = {
    "full": {},
    "no_attribution": {"attribution": False},
    "no_judgment": {"llm_judge": False, "max_refine": 0},
    "no_generation": {"generation": False},
    "generic": {"attribution": False, "generation": False, "llm_judge": False},  # no engine: nothing to judge or calibrate
}
SETS = {"math": "gsm8k", "code": "humaneval"}
# Problems per screen shard (one engine call of N x --screen-k requests): GSM8K in 160s, so a larger
# --problems reuses a smaller run's screen; HumanEval's 164 tasks in one.
SCREEN_SHARD = {"math": 160, "code": 256}


def shared_data() -> Path:
    here = Path(__file__).resolve().parents[2]
    return Path(os.environ.get("MENTOR_SHARED_DATA", here.parent / "shared" / "data"))


# --------------------------------------------------------------------------- problems and reference hints


def split_problems(domain: str, split: str, n: int | None, offset: int = 0):
    """The split's problems from position `offset` (in the split's order), `n` of them (all: None)."""
    import polars as pl

    from mentor.data import BUNDLED_SETS, bundled

    df = pl.read_parquet(bundled(BUNDLED_SETS[SETS[domain]])).with_row_index("_pos")
    if split == "dev":
        df = df.filter(pl.col("_pos") % 2 == 0)
    elif split == "report":
        df = df.filter(pl.col("_pos") % 2 == 1)
    df = df.drop("_pos")
    if offset >= df.height:
        raise SystemExit(f"--offset {offset}: the {split} split has {df.height} problems")
    return df.slice(offset, n)


def reference_solutions(domain: str) -> dict[str, str]:
    """problem_id -> reference solution text (GSM8K worked answer; HumanEval canonical solution)."""
    from mentor.pipeline.ids import text_id

    root = shared_data()
    need = root / ("gsm8k/test.jsonl" if domain == "math" else "humaneval/HumanEval.jsonl.gz")
    if not need.is_file():
        raise SystemExit(f"{need}: not found; the controls and the agents' reference solutions come from ../shared/data "
                         "beside the repository: set MENTOR_SHARED_DATA to that folder (e.g. when running from a git worktree)")
    if domain == "math":
        with open(root / "gsm8k" / "test.jsonl", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        return {text_id(r["question"]): r["answer"] for r in rows}
    with gzip.open(root / "humaneval" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {r["task_id"].lower(): r["canonical_solution"] for r in rows}


_CALC = re.compile(r"<<[^>]*>>")
_CALLS = re.compile(r"\b([A-Za-z_][\w.]*)\s*\(")


def reference_candidates(domain: str, solution: str) -> list[str]:
    """Hints from a reference solution's first step, strongest first."""
    if domain == "math":
        steps = [ln.strip() for ln in _CALC.sub("", solution).split("\n") if ln.strip() and not ln.startswith("####")]
        if not steps:
            return []
        first = steps[0]
        out = [f"A first step: {first}"]
        if "=" in first:
            out.append(f"A first step: {first.rsplit('=', 1)[0].strip()}.")
        return out
    lines = [ln.strip() for ln in solution.split("\n") if ln.strip() and not ln.strip().startswith("#")]
    if len(lines) >= 3:
        return [f"A working solution starts with the line `{lines[0]}`."]
    calls = sorted({c for c in _CALLS.findall(solution) if not c.startswith("_")})
    if calls:
        return [f"A short working solution exists; it uses {', '.join(calls)}."]
    return []


def reference_hints(collapsed, domain: str, hinted_round: int = 0):
    """A hints table (schema: hints) with one leak-checked reference hint per collapsed problem."""
    import pyarrow as pa

    from mentor.pipeline.ids import content_hash
    from mentor.pipeline.schemas import HINTS
    from mentor.stages.hint.agents import Templates
    from mentor.stages.rules import check

    solutions = reference_solutions(domain)
    generic = Templates.load().lines(f"fallback_{domain}")[0]
    rows, fell_back = [], 0
    for r in collapsed.iter_rows(named=True):
        chosen, source = None, "generic"
        for cand in reference_candidates(domain, solutions.get(r["problem_id"], "")):
            if check(cand, domain=domain, answer=r["label"], problem=r["problem"]).ok:
                chosen, source = cand, "reference"
                break
        if chosen is None:
            chosen, fell_back = generic, fell_back + 1
        rows.append({"problem_id": r["problem_id"], "round": hinted_round, "hint_id": content_hash(r["problem_id"], chosen),
                     "hint": chosen, "keywords": [], "error": None, "status": "accepted" if source == "reference" else "fallback",
                     "retries": 0, "refines": 0, "judge_score": None, "violations": [], "trace": [],
                     "model": "reference-solution", "prompt_version": "reference", "config_hash": "reference"})
    schema = pa.schema(list(HINTS))
    return pa.Table.from_pylist(rows, schema=schema), fell_back


# --------------------------------------------------------------------------- positive controls

CONTROLS = ("control_first_step", "control_half", "control_answer")
DEFAULT_CONTROLS = ("control_first_step", "control_half")  # re-rolled beside the hint arms (control_answer: the gate run's uptake)
NEUTRAL = "neutral"
# Neutral text for the neutral arm: no content about any problem, cut to the length of the hint it stands in for.
FILLER = ("Let me read the question once more, slowly and carefully, and keep track of each part of it as I go. "
          "I will write my work out in full so that every line is easy to follow and check. ")


def solution_steps(domain: str, solution: str) -> tuple[list[str], str | None]:
    """A reference solution's steps (GSM8K: its lines without the calculator marks; HumanEval: its code
    lines) and its final answer (GSM8K's ``####`` line; None for code)."""
    if domain == "math":
        lines = [ln.strip() for ln in _CALC.sub("", solution).split("\n") if ln.strip()]
        answer = next((ln[4:].strip() for ln in lines if ln.startswith("####")), None)
        return [ln for ln in lines if not ln.startswith("####")], answer
    return [ln.rstrip() for ln in solution.split("\n") if ln.strip()], None


def control_text(domain: str, kind: str, solution: str, label: str) -> str | None:
    """A positive control's hint: ``control_first_step`` the reference solution's first step (about what a good
    hint says), ``control_half`` the first half of its steps (at least one), ``control_answer`` the whole
    solution and its answer (the uptake ceiling)."""
    steps, answer = solution_steps(domain, solution)
    if not steps:
        return None
    if kind in ("control_first_step", "control_half"):
        part = steps[:1] if kind == "control_first_step" else steps[: max(1, len(steps) // 2)]
        return " ".join(part) if domain == "math" else "A working solution starts:\n```python\n" + "\n".join(part) + "\n```"
    if domain == "math":
        return " ".join(steps) + f" The answer is {answer if answer is not None else label}."
    return "A working solution:\n```python\n" + "\n".join(steps) + "\n```"


def control_hints(collapsed, domain: str, kind: str, hinted_round: int = 0):
    """A hints table (schema: hints) of one positive control; problems without a reference solution are left out.

    Controls are not hints the pipeline could give (they state the solution): they measure whether the
    policy uses what it is given at all, so they skip the rules.
    """
    import pyarrow as pa

    from mentor.pipeline.ids import content_hash
    from mentor.pipeline.schemas import HINTS

    solutions = reference_solutions(domain)
    rows = []
    for r in collapsed.iter_rows(named=True):
        text = control_text(domain, kind, solutions.get(r["problem_id"], ""), r["label"])
        if text is None:
            continue
        rows.append({"problem_id": r["problem_id"], "round": hinted_round, "hint_id": content_hash(r["problem_id"], kind, text),
                     "hint": text, "keywords": [], "error": None, "status": "accepted", "retries": 0, "refines": 0,
                     "judge_score": None, "violations": [], "trace": [], "model": "reference-solution",
                     "prompt_version": kind, "config_hash": kind})
    return pa.Table.from_pylist(rows, schema=pa.schema(list(HINTS)))


def neutral_hints(like, domain: str, hinted_round: int = 0):
    """A hints table (schema: hints) of neutral filler: per problem of `like` (a hints table), `FILLER` cut at a
    word to the length of that problem's hint, so the neutral arm puts text of the same length in the same place
    (LoPE: neutral text alone "rescues" some all-zero groups; a hint must beat it, not only no hint)."""
    import pyarrow as pa

    from mentor.pipeline.ids import content_hash
    from mentor.pipeline.schemas import HINTS

    rows = []
    for r in like.to_pylist():
        n = max(1, len(r["hint"]))
        text = (FILLER * (n // len(FILLER) + 2))[:n + 1]
        text = text[: text.rfind(" ")] if " " in text[1:] else text[:n]
        rows.append({"problem_id": r["problem_id"], "round": hinted_round, "hint_id": content_hash(r["problem_id"], NEUTRAL, text),
                     "hint": text.strip(), "keywords": [], "error": None, "status": "accepted", "retries": 0, "refines": 0,
                     "judge_score": None, "violations": [], "trace": [], "model": "filler", "prompt_version": NEUTRAL,
                     "config_hash": NEUTRAL})
    return pa.Table.from_pylist(rows, schema=pa.schema(list(HINTS)))


def arm_stats(report, arm: str, seed: int, versus: tuple[str, ...] = ("unhinted", NEUTRAL)) -> dict:
    """An arm's rescued problems, mean correctness, and its paired comparisons with each arm of `versus` in the run:
    the rescued-or-not difference (``vs_<arm>``) and the per-problem mean-correctness difference (``per_problem_vs_<arm>``)."""
    out = {"rescued": int(report[f"rescued_{arm}"].sum()), "mean_correct": round(float(report[f"mean_correct_{arm}"].mean()), 4)}
    for other in versus:
        if other == arm or f"rescued_{other}" not in report.columns:
            continue
        out[f"vs_{other}"] = paired(report[f"rescued_{arm}"].to_list(), report[f"rescued_{other}"].to_list(), seed=seed)
        out[f"per_problem_vs_{other}"] = per_problem(report[f"mean_correct_{arm}"].to_list(),
                                                     report[f"mean_correct_{other}"].to_list(), seed=seed)
    return out


def beats(stats: dict, versus: tuple[str, ...] = ("unhinted", NEUTRAL)) -> bool:
    """Whether an arm beats every arm of `versus` on the per-problem endpoint (paired 95% interval above 0)."""
    return all(stats[f"per_problem_vs_{v}"]["ci95"][0] > 0 for v in versus if f"per_problem_vs_{v}" in stats)


def setting_verdict(report, placement: str, gate: str, seed: int) -> dict:
    """Can this setting show a hint effect? The gate control must beat both unhinted and the neutral filler in the
    same place on the per-problem endpoint (paired bootstrap interval of the mean-correctness difference above 0)."""
    neutral = f"{NEUTRAL}_{placement}"
    out = {"bench": "rescue", "step": "setting", "placement": placement, "problems": report.height,
           "unhinted_rescued": int(report["rescued_unhinted"].sum()),
           "unhinted_mean_correct": round(float(report["mean_correct_unhinted"].mean()), 4)}
    if f"rescued_{neutral}" in report.columns:
        out[NEUTRAL] = arm_stats(report, neutral, seed, versus=("unhinted",))
    for kind in CONTROLS:
        arm = f"{kind}_{placement}"
        if f"rescued_{arm}" not in report.columns:
            continue
        st = arm_stats(report.rename({f"rescued_{neutral}": f"rescued_{NEUTRAL}", f"mean_correct_{neutral}": f"mean_correct_{NEUTRAL}"},
                                     strict=False), arm, seed)
        out[kind] = st
    # Uptake: how far the answer-in-prompt arm gets (share of its re-rolls right).
    out["uptake"] = out.get("control_answer", {}).get("mean_correct")
    out["separates"] = gate in out and beats(out[gate])
    out["verdict"] = "controls separate from unhinted and neutral" if out["separates"] else "cannot show a hint effect"
    return out


# --------------------------------------------------------------------------- statistics


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for discordant pairs b (arm only) and c (other only)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def bootstrap_ci(d: list[float], seed: int = 0, resamples: int = 4000) -> tuple[float, float]:
    """95% percentile interval of the mean of `d` over `resamples` paired bootstrap resamples (seeded)."""
    n = len(d)
    if not n:
        return (0.0, 0.0)
    rng = random.Random(seed)
    means = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * (resamples - 1))], means[int(0.975 * (resamples - 1))]


def wilcoxon_p(d: list[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences `d` (zeros dropped, tied ranks averaged):
    exact (the rank sum's distribution given the ranks, by dynamic programming) up to 60 non-zero differences,
    the normal approximation with tie correction above."""
    nz = [x for x in d if x != 0]
    n = len(nz)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(nz[i]))
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(nz[order[j + 1]]) == abs(nz[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    w = sum(r for r, x in zip(ranks, nz) if x > 0)
    if n <= 60:
        twice = [round(2 * r) for r in ranks]  # half ranks: count in halves
        dist = {0: 1}
        for t in twice:
            nxt = dict(dist)
            for s_, c in dist.items():
                nxt[s_ + t] = nxt.get(s_ + t, 0) + c
            dist = nxt
        total, w2 = 2 ** n, round(2 * w)
        lower = sum(c for s_, c in dist.items() if s_ <= w2) / total
        upper = sum(c for s_, c in dist.items() if s_ >= w2) / total
        return min(1.0, 2 * min(lower, upper))
    mean = n * (n + 1) / 4
    ties: dict[float, int] = {}
    for r in ranks:
        ties[r] = ties.get(r, 0) + 1
    var = n * (n + 1) * (2 * n + 1) / 24 - sum(t ** 3 - t for t in ties.values()) / 48
    z = (abs(w - mean) - 0.5) / var ** 0.5 if var > 0 else 0.0
    return min(1.0, max(0.0, 2 * (1 - 0.5 * (1 + erf(z / 2 ** 0.5)))))


def per_problem(x: list[float], y: list[float], seed: int = 0) -> dict:
    """The per-problem endpoint: each problem's mean correctness under x minus under y (the same problems and
    seeds), averaged, with a paired-bootstrap 95% interval and a Wilcoxon signed-rank p; about four times more
    sensitive than the rescued-or-not difference for the same problems."""
    d = [float(a) - float(b) for a, b in zip(x, y)]
    lo, hi = bootstrap_ci(d, seed)
    return {"diff": round(sum(d) / len(d), 4) if d else 0.0, "ci95": [round(lo, 4), round(hi, 4)],
            "better": sum(1 for v in d if v > 0), "worse": sum(1 for v in d if v < 0), "p_wilcoxon": round(wilcoxon_p(d), 4)}


def paired(x: list[bool], y: list[bool], seed: int = 0, resamples: int = 4000) -> dict:
    """Rescue-rate difference x - y over the same problems, with a paired-bootstrap 95% interval."""
    n = len(x)
    b = sum(1 for a, o in zip(x, y) if a and not o)
    c = sum(1 for a, o in zip(x, y) if o and not a)
    rng = random.Random(seed)
    d = [int(a) - int(o) for a, o in zip(x, y)]
    diffs = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples)) if n else [0.0]
    lo, hi = diffs[int(0.025 * (len(diffs) - 1))], diffs[int(0.975 * (len(diffs) - 1))]
    return {"diff": round((b - c) / n, 4) if n else 0.0, "ci95": [round(lo, 4), round(hi, 4)], "b": b, "c": c,
            "p_mcnemar": round(mcnemar_p(b, c), 4)}


# --------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> list[dict]:
    import polars as pl

    from mentor.pipeline.io import read_json, write_parquet_atomic
    from mentor.pipeline.llm import BackendSpec, close_backends, hold_engines
    from mentor.pipeline.stage import Context
    from mentor.stages.hint import HINT
    from mentor.stages.hint.config import HintConfig, load_config
    from mentor.stages.rules import check
    from mentor.stages.build_render import PLACEMENTS, resolve_placement
    from mentor.stages.mine import MINE, MineConfig
    from mentor.stages.rescue import RESCUE
    from mentor.stages.rollout import ROLLOUT, RolloutConfig

    work = Path(args.work) / (f"{args.domain}-{args.split}" + (f"-from{args.offset}" if args.offset else ""))
    work.mkdir(parents=True, exist_ok=True)
    fake = args.backend == "fake"
    policy = BackendSpec("fake", options={"script": args.fake_policy}) if fake else BackendSpec("vllm", args.policy)
    hinter = BackendSpec("fake", options={"script": "mentor.stages.hint.agents:fake_script"}) if fake else BackendSpec("vllm", args.hinter)
    t0 = time.monotonic()

    # 1. screen (or a given collapsed set)
    sampling = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p)
    if args.collapsed:
        collapsed = pl.read_parquet(args.collapsed)
        screened = {"problems": None, "collapsed_from": args.collapsed}
    else:
        problems = split_problems(args.domain, args.split, args.problems, args.offset)
        if args.screen_from:  # screen only these problems (e.g. another policy's collapsed set) with this policy
            ids = pl.read_parquet(args.screen_from, columns=["problem_id"])["problem_id"]
            problems = problems.filter(pl.col("problem_id").is_in(ids.implode()))
            if problems.height == 0:
                raise SystemExit(f"--screen-from {args.screen_from}: none of its problem_ids is among the split's "
                                 f"{args.problems or 'all'} problems from position {args.offset}; widen --rows or --offset")
        write_parquet_atomic(problems, work / "problems.parquet", dataset="problems")
        screen_cfg = RolloutConfig(k=args.screen_k, seed=args.seed, shard_size=SCREEN_SHARD[args.domain], **sampling)
        screen = ROLLOUT({"prompts": [str(work / "problems.parquet")]}, screen_cfg, work / "screen",
                         Context(backend=policy, progress=not args.no_progress)).as_dict()
        MINE({"sources": [str(work / "screen")]}, MineConfig(min_rollouts=args.screen_k), work / "collapsed")
        collapsed = pl.read_parquet(work / "collapsed" / "collapsed.parquet")
        screened = {"problems": problems.height, "screen_mean_correct": screen["mean_correct"],
                    "screen_completion_tokens": screen["completion_tokens"]}
    if args.max_collapsed:
        collapsed = collapsed.sort("problem_id").head(args.max_collapsed)
    (work / "collapsed").mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(collapsed, work / "collapsed" / "selected.parquet", dataset="collapsed")
    source = work / "collapsed" / "selected.parquet"
    print(json.dumps({"bench": "rescue", "step": "screen", **screened, "screen_k": args.screen_k,
                      "collapsed": collapsed.height, "seconds": round(time.monotonic() - t0, 1)}), flush=True)
    if args.screen_only:
        close_backends()
        return []
    if collapsed.height == 0:
        raise SystemExit("no problem stayed collapsed: nothing to rescue")

    # 2. positive controls and the neutral filler (same length as the first step, same place)
    controls: dict[str, list[str]] = {}
    for kind in CONTROLS:
        out = work / "hints" / kind
        write_parquet_atomic(control_hints(collapsed, args.domain, kind), out / "hints.parquet", dataset="hints")
        controls[kind] = [str(out / "hints.parquet")]
    first = pl.read_parquet(controls["control_first_step"][0]).to_arrow()
    write_parquet_atomic(neutral_hints(first, args.domain), work / "hints" / NEUTRAL / "hints.parquet", dataset="hints")
    controls[NEUTRAL] = [str(work / "hints" / NEUTRAL / "hints.parquet")]
    policy_placement = resolve_placement(None, None if fake else args.policy, [args.domain])  # a vllm policy's tokenizer is known
    # Can this setting show a hint effect at all, and under which placement?
    placement, verdicts = args.placement, []
    if args.gate != "off":
        files, where = {}, {}
        for kind in (*CONTROLS, NEUTRAL):
            for place in args.placements:
                files[f"{kind}_{place}"], where[f"{kind}_{place}"] = controls[kind], place
        t1 = time.monotonic()
        RESCUE({"collapsed": [str(source)], "arms": files, "placements": where},
               RolloutConfig(k=args.k, seed=args.seed + 1, **sampling), work / "controls",
               Context(backend=policy, progress=not args.no_progress))
        report = pl.read_parquet(work / "controls" / "rescue.parquet")
        for place in args.placements:
            verdicts.append(setting_verdict(report, place, args.gate, args.seed))
            print(json.dumps({**verdicts[-1], "seconds": round(time.monotonic() - t1, 1)}), flush=True)
        good = [v for v in verdicts if v["separates"]]
        if args.controls_only:
            close_backends()
            print(json.dumps({"bench": "rescue", "step": "done", "verdicts": {v["placement"]: v["verdict"] for v in verdicts},
                              "seconds": round(time.monotonic() - t0, 1), "work": str(work)}), flush=True)
            return verdicts
        if not good:
            close_backends()
            print(json.dumps({"bench": "rescue", "step": "done", "verdict": "cannot show a hint effect",
                              "why": f"{args.gate} does not beat both unhinted and neutral under any of {args.placements}: "
                                     "no hint arm is run",
                              "seconds": round(time.monotonic() - t0, 1), "work": str(work)}), flush=True)
            return verdicts
        if placement is None:  # the separating placement where the gate control does best (then: uptake)
            placement = max(good, key=lambda v: (v[args.gate]["per_problem_vs_unhinted"]["diff"], v["uptake"] or 0))["placement"]
        elif placement not in [v["placement"] for v in good]:
            print(json.dumps({"bench": "rescue", "step": "note", "placement": placement,
                              "note": "this placement's controls do not separate; its hint arms are run because --placement asks"}),
                  flush=True)
    placement = placement or policy_placement
    close_backends()  # an idle vLLM CPU engine still spins: stop the policy's while the hinter runs

    # 3. hints per arm
    arm_files: dict[str, list[str]] = {}
    hint_info: dict[str, dict] = {}
    base = load_config(args.hint_config) if args.hint_config else HintConfig()
    extra = args.arm_config  # {name: hint.yaml}, checked by parse_args

    def hint_arm(cfg: HintConfig, out: Path) -> dict:
        t1 = time.monotonic()
        st = HINT({"collapsed": [str(source)]}, cfg, out, Context(backend=hinter, progress=not args.no_progress)).as_dict()
        # The judge's calibration (stages/hint/judge_check.py) is part of what the arm costs.
        check = read_json(out / "stats.json").get("judge_check") or {}
        calib = check.get("prompt_tokens", 0) + check.get("completion_tokens", 0) if not check.get("reused") else 0
        vouch = st.get("vouch") or {}
        return {"tokens": st["prompt_tokens"] + st["completion_tokens"] + calib, "judge_check_tokens": calib,
                "judge_check": {k: check.get(k) for k in ("status", "action", "balanced_accuracy", "items")} if check else None,
                "vouch": vouch or None, "requests": st["requests"], "waves": st["waves"],
                "accepted": st["accepted"], "repaired": st["repaired"], "fallback": st["fallback"],
                "seconds": round(time.monotonic() - t1, 1),
                "computed_now": read_json(out / "stats.json")["this_run"]["shards_computed"]}

    with hold_engines():  # one hinter engine for every arm (a stage alone would close it as it ends)
        for arm in [*args.arms, *extra]:
            out = work / "hints" / arm
            if arm in extra:
                hint_info[arm] = hint_arm(load_config(extra[arm]), out)
            elif arm == "vouched":  # full, plus the policy's say (stages/hint/vouch.py): re-rolled as the rescue re-rolls
                hint_info[arm] = hint_arm(base.model_copy(update={"vouch": vouch_config(args, placement)}), out)
            elif arm == "reference":
                table, fell_back = reference_hints(collapsed, args.domain)
                write_parquet_atomic(table, out / "hints.parquet", dataset="hints")
                hint_info[arm] = {"tokens": 0, "reference_fell_back_to_generic": fell_back}
            else:
                hint_info[arm] = hint_arm(base.model_copy(update=ARM_CONFIG[arm]), out)
            arm_files[arm] = [str(out / "hints.parquet")]
    close_backends()  # the hinter's engine is not needed any more
    if args.hints_only:
        print(json.dumps({"bench": "rescue", "step": "hints", "arms": {a: hint_info[a] for a in hint_info},
                          "seconds": round(time.monotonic() - t0, 1), "work": str(work)}), flush=True)
        return []

    # 4. one rescue run: unhinted, the neutral filler, the controls and every hint arm, the hint where the controls
    # said (or --placement); with --wordings, each hint arm once per opening of the answer (or other placement)
    hinted = {**{a: arm_files[a] for a in [*args.arms, *extra]}}
    arms_run: dict[str, list[str]] = {NEUTRAL: controls[NEUTRAL], **{c: controls[c] for c in args.controls}}
    where: dict[str, str] = {}
    answers: dict[str, str] = {}
    of_arm: dict[str, str] = {}  # run arm -> hint arm (for tokens and rule checks)
    for arm, files in hinted.items():
        if not args.wordings:
            arms_run[arm], of_arm[arm] = files, arm
            continue
        for w in args.wordings:
            name = f"{arm}_{w}"
            arms_run[name], of_arm[name] = files, arm
            if w in PLACEMENTS:
                where[name] = w
            else:
                where[name], answers[name] = "assistant", w
    t2 = time.monotonic()
    summary = RESCUE({"collapsed": [str(source)], "arms": arms_run, "placements": where, "answers": answers},
                     RolloutConfig(k=args.k, seed=args.seed + 1, placement=placement, **sampling), work / "rescue",
                     Context(backend=policy, progress=not args.no_progress)).as_dict()
    close_backends()
    report = pl.read_parquet(work / "rescue" / "rescue.parquet")
    answers_of = {r["problem_id"]: r for r in collapsed.iter_rows(named=True)}
    lines = []
    names = ["unhinted", *arms_run]
    for arm in names:
        a = summary["arms"][arm]
        failing = None
        src = of_arm.get(arm)
        if src is not None:
            hints = pl.read_parquet(arms_run[arm][0])
            failing = sum(
                0 if check(h["hint"], domain=args.domain, answer=answers_of[h["problem_id"]]["label"],
                           problem=answers_of[h["problem_id"]]["problem"]).ok else 1
                for h in hints.iter_rows(named=True) if h["problem_id"] in answers_of
            )
        line = {
            "bench": "rescue", "domain": args.domain, "split": args.split, "arm": arm,
            "placement": a.get("placement", placement), "answer_template": a.get("answer_template"),
            "policy": args.policy if not fake else "fake", "hinter": args.hinter if not fake else "fake",
            "problems": summary["problems"], "k": args.k, "rescued": a["rescued"], "rescue_rate": a["rescue_rate"],
            "rescue_rate_ci95": a["rescue_rate_ci95"], "mean_correct": a["mean_correct"],
            "hint_tokens_per_problem": round(hint_info.get(src, {}).get("tokens", 0) / max(1, collapsed.height), 1),
            "check_hint_failures": failing,
        }
        if arm != "unhinted":
            versus = ("unhinted", NEUTRAL) + (("generic",) if "generic" in names and arm != "generic" else ())
            line |= {k: v for k, v in arm_stats(report, arm, args.seed, versus).items() if k.startswith(("vs_", "per_problem_vs_"))}
            if arm in args.controls or (src is not None and arm != NEUTRAL):
                line["beats_unhinted_and_neutral"] = beats(line)
            if src is not None:
                line["hint_stage"] = hint_info.get(src)
        lines.append(line)
        print(json.dumps(line), flush=True)
    gate_line = {}
    if args.controls:  # the gate, read off this run: does a control beat both unhinted and neutral here?
        sep = [c for c in args.controls if next(ln for ln in lines if ln["arm"] == c)["beats_unhinted_and_neutral"]]
        gate_line = {"controls_separating": sep,
                     "verdict": "controls separate from unhinted and neutral" if sep else "cannot show a hint effect"}
    print(json.dumps({"bench": "rescue", "step": "done", "placement": placement, **gate_line,
                      "verdicts": {v["placement"]: v["verdict"] for v in verdicts}, "rescue_seconds": round(time.monotonic() - t2, 1),
                      "rescue_completion_tokens": summary["completion_tokens"], "seconds": round(time.monotonic() - t0, 1),
                      "work": str(work), "settings": {k: v for k, v in vars(args).items() if k != "fake_policy"}}), flush=True)
    if not args.no_plot:
        plot(lines, work / "rescue.png", f"{args.domain} {args.split}: {summary['problems']} problems collapsed at 0/{args.screen_k}, k={args.k}")
    return lines


def vouch_config(args: argparse.Namespace, placement: str):
    """The vouched arm's policy settings: the benchmark's policy and sampling, the rescue's placement, and
    re-roll seeds kept apart from the rescue's and the controls' (``--seed + 1``, per problem)."""
    from mentor.pipeline.llm import BackendSettings
    from mentor.stages.hint.config import VouchConfig

    if args.backend == "fake":
        policy = BackendSettings(backend="fake", model="fake", options={"script": args.fake_policy})
    else:
        policy = BackendSettings(backend="vllm", model=args.policy)
    return VouchConfig(policy=policy, samples=args.k, temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                       avoid_seeds=[args.seed + 1], placement=placement)


def plot(lines: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [ln["arm"] for ln in lines]
    rates = [ln["rescue_rate"] for ln in lines]
    lo = [r - ln["rescue_rate_ci95"][0] for r, ln in zip(rates, lines)]
    hi = [ln["rescue_rate_ci95"][1] - r for r, ln in zip(rates, lines)]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(arms, rates, yerr=[lo, hi], capsize=4, color=["#999"] + ["#4c72b0"] * (len(arms) - 1))
    ax.set_ylabel("rescue rate (95% CI)")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, max(0.05, max(ln["rescue_rate_ci95"][1] for ln in lines) * 1.1))
    plt.xticks(rotation=20, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(json.dumps({"bench": "rescue", "plot": str(path)}), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from mentor.pipeline.prompts import ANSWER_TEMPLATES
    from mentor.stages.build_render import DEFAULT_PLACEMENT, DEFAULT_TOKENIZED_PLACEMENT, PLACEMENTS, resolve_placement

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--domain", choices=("math", "code"), default="math")
    p.add_argument("--policy", default="qwen2.5-coder-0.5b", help="Policy model (a mentor CPU model name, folder or HF name).")
    p.add_argument("--hinter", default="qwen2.5-coder-1.5b", help="Hint model for the four agents.")
    p.add_argument("--backend", choices=("vllm", "fake"), default="vllm", help="fake: plumbing only (tests).")
    p.add_argument("--fake-policy", default="mentor.stages.hint.agents:fake_script", help=argparse.SUPPRESS)
    p.add_argument("--problems", "--rows", dest="problems", type=int, help=f"Problems of the split to screen, from --offset (default: 400 math, 177 of them collapsed at 0/8 with the default models, all code; --quick {QUICK_PROBLEMS}).")
    p.add_argument("--offset", type=int, default=0, help="First problem of the split to screen, by position in the split "
                   "(e.g. --offset 400 --rows 200: report problems 400-599, never screened by the runs in docs/benchmarks.md); "
                   "its work folder is <domain>-<split>-from<offset>.")
    p.add_argument("--screen-only", action="store_true", help="Stop after the screen and its collapsed set (a later run reuses both).")
    p.add_argument("--max-collapsed", type=int, help="Keep at most this many collapsed problems (problem_id order).")
    p.add_argument("--screen-k", type=int, default=8, help="Samples of the collapse screen (collapsed = none right).")
    p.add_argument("--k", type=int, default=4, help="Re-rolls per problem and arm.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.6,
                   help="Sampling temperature of every rollout (0.6: at 1.0 the reference arm did not separate from no hint on dev).")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--split", choices=("dev", "report", "all"), help="Default: report (math), all (code: 164 tasks, not tuned on); --quick: dev.")
    p.add_argument("--arms", nargs="+", choices=ARMS, help=f"Default: {' '.join(DEFAULT_ARMS)} (--quick: {' '.join(QUICK_ARMS)}).")
    p.add_argument("--hint-config", help="A hint.yaml the arms start from (the defaults otherwise).")
    p.add_argument("--arm-config", action="append", default=[], metavar="NAME=HINT.YAML",
                   help="An extra arm hinted with this config (repeatable), e.g. a template variant to compare with full.")
    p.add_argument("--placement", choices=PLACEMENTS, help="Where the hint arms' hints go (as `mentor build --placement`); "
                   "default: the separating placement where --gate does best, else the default for a policy whose "
                   f"tokenizer is known ({DEFAULT_TOKENIZED_PLACEMENT}; code and the fake backend: {DEFAULT_PLACEMENT}).")
    p.add_argument("--placements", nargs="+", choices=PLACEMENTS, help="Placements the positive controls are re-rolled under, "
                   "in one run (default: --placement's default; e.g. after assistant to find where the hint is read).")
    p.add_argument("--controls", nargs="*", choices=CONTROLS, default=list(DEFAULT_CONTROLS),
                   help=f"Positive controls re-rolled beside the hint arms in the final run (default: {' '.join(DEFAULT_CONTROLS)}; "
                   "none: leave them out). The neutral filler arm is always there.")
    p.add_argument("--wordings", nargs="+", choices=(*ANSWER_TEMPLATES, *[x for x in PLACEMENTS if x != "assistant"]),
                   help="Re-roll each hint arm once per opening of the answer (placement assistant: "
                   f"{', '.join(ANSWER_TEMPLATES)}) or other placement, as arms <arm>_<wording> of the one rescue run.")
    p.add_argument("--gate", choices=(*CONTROLS, "off"), default="control_half",
                   help="The positive control that must beat both unhinted and the neutral filler (per-problem paired 95%% "
                   "interval above 0) in a controls-only run before any hint arm is run; no placement separating: 'cannot "
                   "show a hint effect', and the run stops. off: no such run (the final run still reports the controls).")
    p.add_argument("--controls-only", action="store_true", help="Stop after the positive controls (a placement sweep).")
    p.add_argument("--hints-only", action="store_true", help="Stop after hinting the arms (a later run without it reuses "
                   "them and re-rolls).")
    p.add_argument("--collapsed", help="Use this collapsed.parquet instead of screening "
                   "(e.g. tests/benchmarks/data/gsm8k-report-collapsed.parquet, the math report split's 177).")
    p.add_argument("--screen-from", help="Screen only the split's problems whose problem_id is in this Parquet file "
                   "(e.g. another policy's collapsed set), with this policy.")
    p.add_argument("--quick", action="store_true", help=f"A small setting for iterating: {QUICK_PROBLEMS} dev problems screened "
                   f"(the screen is reused after the first run), arms {' '.join(QUICK_ARMS)}.")
    p.add_argument("--no-progress", action="store_true", help="No progress bars (stderr).")
    p.add_argument("--work", help="Where every stage writes (resumable); default: bench/rescue in the mentor cache "
                   "(~/.cache/mentor, or $MENTOR_CACHE), outside the repository.")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.split = args.split or ("dev" if args.quick else "report" if args.domain == "math" else "all")
    args.arms = list(args.arms or (QUICK_ARMS if args.quick else DEFAULT_ARMS))
    extra: dict[str, str] = {}
    for spec in args.arm_config:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            p.error(f"--arm-config {spec!r}: expected NAME=HINT.YAML")
        if name in ("unhinted", *args.arms, *extra):
            p.error(f"--arm-config {spec!r}: arm {name!r} is already in the run; leave it out of --arms or pick another name")
        extra[name] = path
    args.arm_config = extra
    if args.problems is None:
        args.problems = QUICK_PROBLEMS if args.quick else (400 if args.domain == "math" else None)
    default = resolve_placement(None, None if args.backend == "fake" else args.policy, [args.domain])
    args.placements = list(dict.fromkeys(args.placements or [args.placement or default]))
    if args.placement and args.placement not in args.placements:
        args.placements.append(args.placement)
    if args.work is None:
        from mentor.pipeline.models import cache_dir

        args.work = str(cache_dir() / "bench" / "rescue")
    if args.quick:
        args.work = str(Path(args.work) / "quick")
    return args


def _stop_on_interrupt() -> None:
    """Ctrl-C (or SIGTERM) stops the run within seconds, the engine's processes included; a rerun resumes.

    A Python signal handler runs only when the main thread is back in the
    interpreter, and while vLLM samples it can sit in a blocking call for tens
    of seconds (measured: 13 s on SIGINT, then 11 s of engine shutdown). The C
    handler still writes the signal to the wakeup fd at once, so a thread reads
    it, asks the engine's processes to stop (SIGTERM, then SIGKILL after 3 s)
    and ends the process. Every stage writes a shard under a temporary name and
    renames it when whole, so nothing half-written is left and a rerun resumes
    from the last finished shard.
    """
    import threading

    import psutil

    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)  # the thread below acts; the main thread must not unwind

    def stop() -> None:
        signum = os.read(r, 1)[0]
        print(json.dumps({"bench": "rescue", "step": "stopped", "signal": signal.Signals(signum).name,
                          "note": "rerun the same command to resume"}), flush=True)
        children = psutil.Process().children(recursive=True)
        for child in children:
            try:
                child.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(children, timeout=3)
        for child in alive:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        os._exit(128 + signum)

    threading.Thread(target=stop, name="stop-on-signal", daemon=True).start()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _stop_on_interrupt()
    run(parse_args(sys.argv[1:]))
