"""Does mentor rescue collapsed problems? A paired benchmark of the hint stage and its ablations.

    python tests/benchmarks/bench_rescue.py [--domain math|code] [--policy MODEL] [--hinter MODEL]
        [--problems N] [--screen-k 8] [--k 4] [--seed 0] [--split dev|report|all] [--quick]

1. Screen: roll out the policy on the problems of the split (GSM8K test for
   math, HumanEval for code) with ``--screen-k`` samples (default 8, i.e. two
   independent draws of k=4) and mine the problems that got none right
   (`mentor rollout` + `mentor mine`). Problems collapsed at k=4 by sampling
   noise alone mostly come back on a second draw; 0/8 keeps the ones this
   policy fails systematically (what consecutive collapsed rounds select).
2. Hint the collapsed set under each arm, through `mentor hint` and its config:
   ``full`` (Attribution -> Generation -> Judgment -> Repair, the defaults),
   ``no_attribution`` (``attribution: false``: generation from the problem
   alone), ``no_judgment`` (``llm_judge: false, max_refine: 0``: the first
   generated hint that passes the rule checks), ``no_generation``
   (``generation: false``: the keyword template; opt-in), ``generic``
   (``attribution: false, generation: false``: the safe default hint, no
   engine), and ``reference`` (an upper bound: the reference solution's first
   step, leak-checked by the rules; else its first step cut before the result;
   else the generic hint).
3. Re-roll every collapsed problem k times under every arm and without a hint
   (``unhinted``) in one `mentor rescue` run: same problems, same seeds, one
   engine batch per shard (on CPU, batch composition changes the numerics, so
   arms are only compared within one run).

One JSON line per arm: rescue rate (problems with >= 1 correct re-roll) with a
95% Wilson interval, mean correctness of the re-rolls, hint-engine tokens per
problem, hints failing `check-hint`, and paired comparisons with ``unhinted``
and ``generic`` (difference of rescue rates with a 95% paired-bootstrap
interval, exact McNemar p). A PNG bar chart beside the outputs.

Splits: dev = even positions of the problem set, report = odd positions, all =
both. Tune on dev, report on report. Every step is a resumable mentor stage
under ``--work``: rerunning after a change recomputes only what it affects.
Needs ../shared/data (MENTOR_SHARED_DATA) for the reference solutions.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import sys
import time
from math import comb
from pathlib import Path

ARMS = ("generic", "full", "no_attribution", "no_judgment", "no_generation", "reference")
DEFAULT_ARMS = ("generic", "full", "no_attribution", "no_judgment", "reference")
QUICK_ARMS = ("generic", "full", "reference")
# HintConfig overrides per arm (on top of the --hint-config file, if any).
ARM_CONFIG = {
    "full": {},
    "no_attribution": {"attribution": False},
    "no_judgment": {"llm_judge": False, "max_refine": 0},
    "no_generation": {"generation": False},
    "generic": {"attribution": False, "generation": False},
}
SETS = {"math": "gsm8k", "code": "humaneval"}
# Problems per screen shard (one engine call of N x --screen-k requests): GSM8K in 160s, so a larger
# --problems reuses a smaller run's screen; HumanEval's 164 tasks in one.
SCREEN_SHARD = {"math": 160, "code": 256}


def shared_data() -> Path:
    here = Path(__file__).resolve().parents[2]
    return Path(os.environ.get("MENTOR_SHARED_DATA", here.parent / "shared" / "data"))


# --------------------------------------------------------------------------- problems and reference hints


def split_problems(domain: str, split: str, n: int | None):
    import polars as pl

    from mentor.data import BUNDLED_SETS, bundled

    df = pl.read_parquet(bundled(BUNDLED_SETS[SETS[domain]])).with_row_index("_pos")
    if split == "dev":
        df = df.filter(pl.col("_pos") % 2 == 0)
    elif split == "report":
        df = df.filter(pl.col("_pos") % 2 == 1)
    df = df.drop("_pos")
    return df.head(n) if n else df


def reference_solutions(domain: str) -> dict[str, str]:
    """problem_id -> reference solution text (GSM8K worked answer; HumanEval canonical solution)."""
    from mentor.pipeline.ids import text_id

    root = shared_data()
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
    from mentor.stages.hint_agents import Templates
    from mentor.stages.hint_rules import check

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


# --------------------------------------------------------------------------- statistics


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for discordant pairs b (arm only) and c (other only)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


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
    from mentor.pipeline.llm import BackendSpec, close_backends
    from mentor.stages.hint import HintConfig, hint_to_dir, load_config
    from mentor.stages.hint_rules import check
    from mentor.stages.mine import MineConfig, mine_to_dir
    from mentor.stages.rollout import RolloutConfig, rescue_to_dir, rollout_to_dir

    work = Path(args.work) / f"{args.domain}-{args.split}"
    work.mkdir(parents=True, exist_ok=True)
    fake = args.backend == "fake"
    policy = BackendSpec("fake", options={"script": args.fake_policy}) if fake else BackendSpec("vllm", args.policy)
    hinter = BackendSpec("fake", options={"script": "mentor.stages.hint_agents:fake_script"}) if fake else BackendSpec("vllm", args.hinter)
    t0 = time.monotonic()

    # 1. screen
    problems = split_problems(args.domain, args.split, args.problems)
    write_parquet_atomic(problems, work / "problems.parquet", dataset="problems")
    sampling = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p)
    screen_cfg = RolloutConfig(k=args.screen_k, seed=args.seed, shard_size=SCREEN_SHARD[args.domain], **sampling)
    screen = rollout_to_dir([str(work / "problems.parquet")], work / "screen", screen_cfg, policy)
    mine_to_dir([str(work / "screen")], work / "collapsed", MineConfig(min_rollouts=args.screen_k))
    collapsed = pl.read_parquet(work / "collapsed" / "collapsed.parquet")
    if args.max_collapsed:
        collapsed = collapsed.sort("problem_id").head(args.max_collapsed)
        write_parquet_atomic(collapsed, work / "collapsed" / "selected.parquet", dataset="collapsed")
    source = work / "collapsed" / ("selected.parquet" if args.max_collapsed else "collapsed.parquet")
    print(json.dumps({"bench": "rescue", "step": "screen", "problems": problems.height, "screen_k": args.screen_k,
                      "collapsed": collapsed.height, "screen_mean_correct": screen["mean_correct"],
                      "screen_completion_tokens": screen["completion_tokens"], "seconds": round(time.monotonic() - t0, 1)}),
          flush=True)
    if collapsed.height == 0:
        raise SystemExit("no problem stayed collapsed: nothing to rescue")
    close_backends()  # an idle vLLM CPU engine still spins: stop the policy's while the hinter runs

    # 2. hints per arm
    arm_files: dict[str, list[str]] = {}
    hint_info: dict[str, dict] = {}
    base = load_config(args.hint_config) if args.hint_config else HintConfig()
    extra = args.arm_config  # {name: hint.yaml}, checked by parse_args

    def hint_arm(cfg: HintConfig, out: Path) -> dict:
        t1 = time.monotonic()
        st = hint_to_dir(str(source), out, cfg, hinter).as_dict()
        return {"tokens": st["prompt_tokens"] + st["completion_tokens"], "requests": st["requests"], "waves": st["waves"],
                "accepted": st["accepted"], "repaired": st["repaired"], "fallback": st["fallback"],
                "seconds": round(time.monotonic() - t1, 1),
                "computed_now": read_json(out / "stats.json")["this_run"]["shards_computed"]}

    for arm in [*args.arms, *extra]:
        out = work / "hints" / arm
        if arm in extra:
            hint_info[arm] = hint_arm(load_config(extra[arm]), out)
        elif arm == "reference":
            table, fell_back = reference_hints(collapsed, args.domain)
            write_parquet_atomic(table, out / "hints.parquet", dataset="hints")
            hint_info[arm] = {"tokens": 0, "reference_fell_back_to_generic": fell_back}
        else:
            hint_info[arm] = hint_arm(base.model_copy(update=ARM_CONFIG[arm]), out)
        arm_files[arm] = [str(out / "hints.parquet")]
    close_backends()  # the hinter's engine is not needed any more

    # 3. re-roll under every arm
    t2 = time.monotonic()
    summary = rescue_to_dir([str(source)], arm_files, work / "rescue", RolloutConfig(k=args.k, seed=args.seed + 1, **sampling), policy)
    close_backends()
    report = pl.read_parquet(work / "rescue" / "rescue.parquet")
    answers = {r["problem_id"]: r for r in collapsed.iter_rows(named=True)}
    lines = []
    names = ["unhinted", *args.arms, *extra]
    for arm in names:
        a = summary["arms"][arm]
        failing = None
        if arm != "unhinted":
            hints = pl.read_parquet(arm_files[arm][0])
            failing = sum(
                0 if check(h["hint"], domain=args.domain, answer=answers[h["problem_id"]]["label"],
                           problem=answers[h["problem_id"]]["problem"]).ok else 1
                for h in hints.iter_rows(named=True) if h["problem_id"] in answers
            )
        x = report[f"rescued_{arm}"].to_list()
        line = {
            "bench": "rescue", "domain": args.domain, "split": args.split, "arm": arm,
            "policy": args.policy if not fake else "fake", "hinter": args.hinter if not fake else "fake",
            "problems": summary["problems"], "k": args.k, "rescued": a["rescued"], "rescue_rate": a["rescue_rate"],
            "rescue_rate_ci95": a["rescue_rate_ci95"], "mean_correct": a["mean_correct"],
            "hint_tokens_per_problem": round(hint_info.get(arm, {}).get("tokens", 0) / max(1, collapsed.height), 1),
            "check_hint_failures": failing,
        }
        if arm != "unhinted":
            line["vs_unhinted"] = paired(x, report["rescued_unhinted"].to_list(), seed=args.seed)
            if "generic" in names and arm != "generic":
                line["vs_generic"] = paired(x, report["rescued_generic"].to_list(), seed=args.seed)
            line["hint_stage"] = hint_info.get(arm)
        lines.append(line)
        print(json.dumps(line), flush=True)
    print(json.dumps({"bench": "rescue", "step": "done", "rescue_seconds": round(time.monotonic() - t2, 1),
                      "rescue_completion_tokens": summary["completion_tokens"], "seconds": round(time.monotonic() - t0, 1),
                      "work": str(work), "settings": {k: v for k, v in vars(args).items() if k != "fake_policy"}}), flush=True)
    if not args.no_plot:
        plot(lines, work / "rescue.png", f"{args.domain} {args.split}: {summary['problems']} problems collapsed at 0/{args.screen_k}, k={args.k}")
    return lines


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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--domain", choices=("math", "code"), default="math")
    p.add_argument("--policy", default="qwen2.5-coder-0.5b", help="Policy model (a mentor CPU model name, folder or HF name).")
    p.add_argument("--hinter", default="qwen2.5-coder-1.5b", help="Hint model for the four agents.")
    p.add_argument("--backend", choices=("vllm", "fake"), default="vllm", help="fake: plumbing only (tests).")
    p.add_argument("--fake-policy", default="mentor.stages.hint_agents:fake_script", help=argparse.SUPPRESS)
    p.add_argument("--problems", type=int, help="Problems of the split to screen (default: 400 math, 177 of them collapsed at 0/8 with the default models, all code; --quick 60).")
    p.add_argument("--max-collapsed", type=int, help="Keep at most this many collapsed problems (problem_id order).")
    p.add_argument("--screen-k", type=int, default=8, help="Samples of the collapse screen (collapsed = none right).")
    p.add_argument("--k", type=int, default=4, help="Re-rolls per problem and arm.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.6,
                   help="Sampling temperature of every rollout (0.6: at 1.0 the reference arm did not separate from no hint on dev).")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--split", choices=("dev", "report", "all"), help="Default: report (math), all (code: 164 tasks, not tuned on).")
    p.add_argument("--arms", nargs="+", choices=ARMS, help=f"Default: {' '.join(DEFAULT_ARMS)} (--quick: {' '.join(QUICK_ARMS)}).")
    p.add_argument("--hint-config", help="A hint.yaml the arms start from (the defaults otherwise).")
    p.add_argument("--arm-config", action="append", default=[], metavar="NAME=HINT.YAML",
                   help="An extra arm hinted with this config (repeatable), e.g. a template variant to compare with full.")
    p.add_argument("--quick", action="store_true", help="A small setting for iterating: 60 dev problems, arms generic full reference (30 to 40 minutes on 2 cores).")
    p.add_argument("--work", default="runs/bench-rescue", help="Where every stage writes (resumable).")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.split = args.split or ("report" if args.domain == "math" else "all")
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
        args.problems = 60 if args.quick else (400 if args.domain == "math" else None)
    if args.quick:
        args.work = str(Path(args.work) / "quick")
    return args


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run(parse_args(sys.argv[1:]))
