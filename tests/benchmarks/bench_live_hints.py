"""Do live hints restore the GRPO signal? Two TRL rounds on the same prompts and seed, without and with live hints.

    python tests/benchmarks/bench_live_hints.py [--policy qwen2.5-coder-0.5b] [--hinter MODEL] [--problems N]
        [--prompts-per-step 4] [--steps 3] [--group-size 4] [--max-completion-length 192] [--cpu-threads 1]
        [--seed 0] [--placement after] [--port 18124] [--work DIR] [--out FILE]
        [--micro-batch N] [--gradient-checkpointing] [--temperature T] [--modes off,live]

The quantity the method restores is the share of groups with a non-zero advantage: a group whose
rewards are all equal (all 0, on a collapsed problem) gives GRPO no gradient. This script measures it
per step, with and without live hints, and the seconds live hints add to a step.

1. Problems: the first ``--problems`` rows of ``tests/benchmarks/data/gsm8k-report-collapsed.parquet``
   (GSM8K report-split problems on which qwen2.5-coder-0.5b got 0 of 8 right), taken from the bundled
   GSM8K set by problem id, so their labels and the bundled reference solutions the hint agents read are
   mentor's own. Most groups of the 0.5B policy collapse on them without hints, which is the setting live
   hints are for (on problems the policy already solves, there is nothing to restore). `mentor build
   --base <that Parquet> --round 1` makes the round's prompt shards, shared by both rounds.
2. ``off``: `mentor train --config round.yaml` with ``kind: trl`` (TRL's own GRPOTrainer), the policy as
   ``actor_model``, ``--steps`` steps of ``--prompts-per-step`` prompts x ``--group-size`` completions.
   Each step generates and scores all of them at once (one generation batch, TRL's ``steps_per_generation``);
   ``--micro-batch N`` only splits the loss's forward and backward into micro-batches of N completions
   (``per_device_train_batch_size`` N, ``gradient_accumulation_steps`` the rest), and
   ``--gradient-checkpointing`` recomputes activations in the backward: both trade seconds for memory
   without changing the generations, the rewards or the loss (full fine-tuning of the 0.5B policy in
   float32 with one micro-batch of 16 completions outgrows 24 GiB).
3. ``live``: the same round config (same prompts, seed and settings) plus ``live_hints``, whose hint engine is
   a `mentor serve` server for ``--hinter`` started here on ``--port`` (only for this round, so it does
   not load the machine during ``off``) and stopped after it.
4. Both rounds' rollout logs (the JSONL records of `mentor.training.rollout_log`) are read back. A group is
   the records of one step with one problem id and one prompt text (in a live round the trained-on ones:
   every ``live_status`` but ``hinted``, the collapsed first pass that the re-rolls replaced); it has a
   non-zero advantage when its rewards are not all equal. The step's seconds are TRL's ``step_time``
   (generation, hinting, re-roll and the optimizer step) from train.log, with ``mentor/live_hint_seconds``
   and ``mentor/live_reroll_seconds`` beside it; TRL's own ``frac_reward_zero_std`` is printed as a check.

One JSON line per mode and step, then a ``summary`` line: the mean share per mode, the live round's share on
its own first pass (its generations before any hint; ``same_first_pass_as_off`` says where they equal the off
round's: at step 0 with the same seed, not after a re-roll has drawn from the sampler's random state), and the added seconds per step (mean live
``step_time`` minus mean off ``step_time``). Lines go to stdout and to ``--out`` (written under a temporary
name, then renamed).

Resumable: everything goes under ``--work`` (default: bench/live_hints in the mentor cache, ~/.cache/mentor,
outside the repository), in a folder named by a hash of the settings. A round that finished (its
``outcome.json`` says exit 0) is reused; one that did not is removed and run again, so nothing half-done is
read. The prompt shards are built under a temporary name and renamed.

The CPU models come from `mentor setup-cpu --model NAME` (`mentor.pipeline.models`); the default hinter is
qwen2.5-coder-1.5b when it is set up, else the embedded smollm2-135m. No reference solutions from
../shared/data are needed: the agents read the bundled GSM8K solutions (`mentor.stages.solutions`).
"""

from __future__ import annotations

import argparse
import ast
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

HERE = Path(__file__).resolve().parent
COLLAPSED = HERE / "data" / "gsm8k-report-collapsed.parquet"
MODES = ("off", "live")
ROUND = 1


# --------------------------------------------------------------------------- reading a round back


def read_records(log_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every rollout record of a round's log folder (whole shards only: temp shards start with a dot)."""
    out: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(str(log_dir), "*.jsonl"))):
        with open(path, encoding="utf-8") as fh:
            out += [json.loads(line) for line in fh if line.strip()]
    return out


def trained_on(rec: dict[str, Any]) -> bool:
    """A record the trainer's loss used: all of an offline round; in a live round all but the replaced first pass."""
    return rec.get("live_status") != "hinted"


def first_pass(rec: dict[str, Any]) -> bool:
    """A record of the step's first generation (before any hint): all but the live re-rolls."""
    return not rec.get("live_rerolled", False)


def step_groups(records: Iterable[dict[str, Any]], group_size: int, keep=trained_on) -> dict[int, list[list[float]]]:
    """step -> the rewards of each group of that step (records kept by `keep`, grouped by problem id and prompt,
    in log order; a problem drawn twice in one step is split into groups of `group_size`)."""
    by: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    for rec in records:
        if keep(rec):
            by[(int(rec.get("step") or 0), rec["problem_id"], rec["prompt"])].append(float(rec["reward"]))
    out: dict[int, list[list[float]]] = defaultdict(list)
    for (step, pid, _), rewards in by.items():
        if len(rewards) % group_size:
            raise SystemExit(f"step {step}, problem {pid}: {len(rewards)} rollouts is not a whole number of groups "
                             f"of {group_size}; was the round run with another --group-size?")
        out[step] += [rewards[i:i + group_size] for i in range(0, len(rewards), group_size)]
    return dict(sorted(out.items()))


def advantage_share(records: Iterable[dict[str, Any]], group_size: int, keep=trained_on) -> dict[int, dict[str, Any]]:
    """step -> groups, groups with a non-zero advantage (rewards not all equal) and their share."""
    out = {}
    for step, groups in step_groups(records, group_size, keep).items():
        live = sum(1 for g in groups if max(g) != min(g))
        out[step] = {"groups": len(groups), "nonzero_adv": live, "share": round(live / len(groups), 4)}
    return out


def same_first_pass(off: Iterable[dict[str, Any]], live: Iterable[dict[str, Any]]) -> dict[int, bool]:
    """step -> whether the live round's first generation equals the off round's (same problems, same responses).
    True at step 0 with the same seed; later steps differ once a re-roll has drawn from the sampler's random state."""
    def responses(records):
        out: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for rec in records:
            if first_pass(rec):
                out[int(rec.get("step") or 0)][rec["problem_id"]].append(rec["response"])
        return {step: {pid: sorted(rs) for pid, rs in by.items()} for step, by in out.items()}

    a, b = responses(off), responses(live)
    return {step: a.get(step) == b.get(step) for step in sorted(set(a) | set(b))}


def logged_steps(train_log: str | os.PathLike) -> list[dict[str, Any]]:
    """TRL's per-step metric dicts from train.log (logging_steps 1), values as floats, in step order."""
    out = []
    with open(train_log, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if "'step_time'" not in line:
                continue
            text = line[line.index("{'"): line.rindex("}") + 1]
            out.append({k: _num(v) for k, v in ast.literal_eval(text).items()})
    return out


def _num(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


# --------------------------------------------------------------------------- running the rounds


def settings_key(args: argparse.Namespace) -> str:
    keys = ("policy", "hinter", "problems", "prompts_per_step", "steps", "group_size", "max_completion_length",
            "cpu_threads", "seed", "placement", "hint_max_tokens", "micro_batch", "gradient_checkpointing")
    chosen = {k: getattr(args, k) for k in keys}
    if args.temperature is not None:  # keyed only when set, so the rounds of earlier runs are still found
        chosen["temperature"] = args.temperature
    blob = json.dumps(chosen, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def mentor(*argv: str, log: Path) -> None:
    cmd = [sys.executable, "-m", "mentor.workflows.cli", *argv]
    with open(log, "ab") as fh:
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if rc:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}; see {log}")


def build_prompts(args: argparse.Namespace, work: Path) -> Path:
    """The round's prompt shards from the collapsed problems (built once, renamed into place)."""
    import polars as pl

    from mentor.data import BUNDLED_SETS, bundled

    out = work / "prompts"
    if (out / "manifest.json").is_file():
        return out
    ids = pl.read_parquet(COLLAPSED, columns=["problem_id"]).head(args.problems)["problem_id"].to_list()
    if len(ids) < args.problems:
        raise SystemExit(f"--problems {args.problems}: {COLLAPSED} has {len(ids)} problems")
    base = pl.read_parquet(bundled(BUNDLED_SETS["gsm8k"]))
    base = base.filter(pl.col("problem_id").is_in(ids))
    base = base.with_columns(pl.col("problem_id").replace_strict(ids, list(range(len(ids)))).alias("_o")).sort("_o").drop("_o")
    if base.height != len(ids):
        raise SystemExit(f"{COLLAPSED}: {len(ids) - base.height} problem id(s) are not in the bundled GSM8K set")
    problems = work / "problems.parquet"
    base.write_parquet(work / ".problems.parquet")
    os.replace(work / ".problems.parquet", problems)
    tmp = work / ".prompts"
    shutil.rmtree(tmp, ignore_errors=True)
    mentor("build", "--base", str(problems), "--round", str(ROUND), "--out", str(tmp), log=work / "build.log")
    os.replace(tmp, out)
    return out


def round_yaml(args: argparse.Namespace, root: Path, prompts: Path, policy: str, live: bool) -> str:
    cfg: dict[str, Any] = {
        "kind": "trl", "round": ROUND, "round_dir": str(root / f"round-{ROUND:03d}"), "actor_model": policy,
        "prompts": str(prompts), "limit": args.problems, "max_steps": args.steps, "num_generations": args.group_size,
        # One generation batch per step (steps_per_generation = gradient_accumulation_steps), in micro-batches.
        "per_device_train_batch_size": args.micro_batch,
        "gradient_accumulation_steps": args.prompts_per_step * args.group_size // args.micro_batch,
        "gradient_checkpointing": args.gradient_checkpointing,
        "max_completion_length": args.max_completion_length, "cpu_threads": args.cpu_threads, "seed": args.seed,
        "save_strategy": "no", "logging_steps": 1,
    }
    if args.temperature is not None:
        cfg["temperature"] = args.temperature  # a GRPOConfig field: the first pass and the re-rolls alike
    if live:
        per = {"attribution": args.hint_max_tokens, "generation": args.hint_max_tokens,
               "judgment": args.hint_max_tokens // 2, "repair": args.hint_max_tokens}
        cfg["live_hints"] = {
            "backend": {"backend": "openai", "base_url": f"http://127.0.0.1:{args.port}/v1", "model": args.hinter},
            "max_problems_per_step": args.prompts_per_step, "placement": args.placement,
            # One attempt per agent (no refinement, no retry), no LLM judge: what one step can afford on a CPU.
            "hint": {"max_refine": 0, "max_retry": 0, "llm_judge": False, "max_tokens": per},
        }
    return json.dumps(cfg, indent=1) + "\n"  # JSON is YAML


def finished(root: Path) -> bool:
    outcome = root / f"round-{ROUND:03d}" / "train" / "outcome.json"
    try:
        return json.loads(outcome.read_text()).get("exit_code") == 0
    except (OSError, ValueError):
        return False


def start_server(args: argparse.Namespace, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mentor.workflows.cli", "serve", "--model", args.hinter, "--served-model-name", args.hinter,
           "--port", str(args.port), "--max-model-len", "4096"]
    url = f"http://127.0.0.1:{args.port}/v1/models"
    if answers(url):
        raise SystemExit(f"--port {args.port}: a server already answers there; stop it or pick another --port")
    proc = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(360):
        if proc.poll() is not None:
            raise SystemExit(f"the hint server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return proc
        except OSError:
            time.sleep(5)
    stop_server(proc)
    raise SystemExit(f"the hint server did not come up in 30 minutes; see {log}")


def answers(url: str) -> bool:
    """Whether anything answers HTTP at `url` (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def stop_server(proc: subprocess.Popen) -> None:
    with _quiet():
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with _quiet():
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        return typ is ProcessLookupError


def run_round(args: argparse.Namespace, work: Path, prompts: Path, policy: str, mode: str) -> Path:
    root = work / mode
    if finished(root):
        print(json.dumps({"bench": "live_hints", "mode": mode, "note": f"reusing the finished round in {root}"}), flush=True)
        return root / f"round-{ROUND:03d}"
    shutil.rmtree(root, ignore_errors=True)  # a killed attempt: run it again from scratch
    root.mkdir(parents=True)
    (root / "round.yaml").write_text(round_yaml(args, root, prompts, policy, mode == "live"))
    server = start_server(args, root / "serve.log") if mode == "live" else None
    try:
        t0 = time.time()
        mentor("train", "--config", str(root / "round.yaml"), log=root / "mentor-train.log")
        print(json.dumps({"bench": "live_hints", "mode": mode, "note": "round finished", "wall_s": round(time.time() - t0, 1)}),
              flush=True)
    finally:
        if server is not None:
            stop_server(server)
    return root / f"round-{ROUND:03d}"


# --------------------------------------------------------------------------- report


def mode_lines(mode: str, round_dir: Path, group_size: int) -> list[dict[str, Any]]:
    records = read_records(round_dir / "rollouts" / "log")
    shares = advantage_share(records, group_size)
    firsts = advantage_share(records, group_size, keep=first_pass)
    logged = logged_steps(round_dir / "train" / "train.log")
    problems = defaultdict(set)
    for rec in records:
        problems[int(rec.get("step") or 0)].add(rec["problem_id"])
    lines = []
    for i, (step, s) in enumerate(shares.items()):
        m = logged[i] if i < len(logged) else {}
        line = {"bench": "live_hints", "mode": mode, "step": step, **s}
        if mode == "live":
            line["first_pass_share"] = firsts[step]["share"]
        line |= {"step_time_s": m.get("step_time"), "hint_s": m.get("mentor/live_hint_seconds"),
                 "reroll_s": m.get("mentor/live_reroll_seconds"),
                 "trl_frac_reward_zero_std": m.get("frac_reward_zero_std"), "problems": sorted(problems[step])}
        lines.append(line)
    return lines


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return round(sum(xs) / len(xs), 3) if xs else None


def summary(lines: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    by = {m: [x for x in lines if x["mode"] == m] for m in MODES}  # a mode not run: no lines
    out: dict[str, Any] = {"bench": "live_hints", "step": "summary", "policy": args.policy, "hinter": args.hinter,
                           "problems": args.problems, "prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
                           "steps": args.steps, "max_completion_length": args.max_completion_length, "seed": args.seed,
                           "micro_batch": args.micro_batch, "gradient_checkpointing": args.gradient_checkpointing}
    for m in MODES:
        out[f"{m}_mean_share"] = _mean([x["share"] for x in by[m]])
        out[f"{m}_mean_step_s"] = _mean([x["step_time_s"] for x in by[m]])
    out["live_first_pass_mean_share"] = _mean([x.get("first_pass_share") for x in by["live"]])
    out["live_mean_hint_s"] = _mean([x["hint_s"] for x in by["live"]])
    if out["off_mean_step_s"] is not None and out["live_mean_step_s"] is not None:
        out["added_s_per_step"] = round(out["live_mean_step_s"] - out["off_mean_step_s"], 3)
    if by["off"] and by["live"]:
        out["same_problems_per_step"] = [x["problems"] for x in by["off"]] == [x["problems"] for x in by["live"]]
    if by["live"]:  # the live round's own pairs: each step's groups before and after its hints, same policy
        gains = [x["share"] - x["first_pass_share"] for x in by["live"]
                 if isinstance(x.get("first_pass_share"), (int, float))]
        out["live_gain_over_first_pass"] = _mean(gains)
    out["temperature"] = args.temperature
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from mentor.pipeline.errors import ConfigError
    from mentor.pipeline.models import resolve_model

    try:
        policy = resolve_model(args.policy)
        resolve_model(args.hinter)  # set up? (`mentor serve` loads it by name)
    except ConfigError as exc:
        raise SystemExit(str(exc)) from exc
    work = Path(args.work) / settings_key(args)
    work.mkdir(parents=True, exist_ok=True)
    (work / "settings.json").write_text(json.dumps(vars(args), indent=1, sort_keys=True) + "\n")
    prompts = build_prompts(args, work)
    lines: list[dict[str, Any]] = []
    dirs = {mode: run_round(args, work, prompts, policy, mode) for mode in MODES if mode in args.modes}
    for mode in dirs:
        lines += mode_lines(mode, dirs[mode], args.group_size)
    if len(dirs) == len(MODES):
        same = same_first_pass(*(read_records(dirs[m] / "rollouts" / "log") for m in MODES))
        for line in lines:
            if line["mode"] == "live":
                line["same_first_pass_as_off"] = same.get(line["step"], False)
    lines.append(summary(lines, args))
    out = Path(args.out) if args.out else work / "results.jsonl"
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    os.replace(tmp, out)
    for x in lines:
        print(json.dumps(x), flush=True)
    return lines


def default_hinter() -> str:
    from mentor.pipeline.models import EMBEDDED_ALIAS, SPLIT_MODELS, is_converted

    return "qwen2.5-coder-1.5b" if is_converted(SPLIT_MODELS["qwen2.5-coder-1.5b"].folder()) else EMBEDDED_ALIAS


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="qwen2.5-coder-0.5b", help="The trained policy: a CPU model name "
                   "(`mentor setup-cpu --model`) or a model folder (default: qwen2.5-coder-0.5b).")
    p.add_argument("--hinter", help="The hint engine's model, served by `mentor serve` (default: qwen2.5-coder-1.5b when "
                   "set up, else smollm2-135m).")
    p.add_argument("--problems", type=int, help="Problems (the first N of the collapsed set; default: "
                   "--prompts-per-step x --steps, so every step sees new problems).")
    p.add_argument("--prompts-per-step", type=int, default=4, help="Groups per step (default 4).")
    p.add_argument("--steps", type=int, default=3, help="Training steps per round (default 3).")
    p.add_argument("--group-size", type=int, default=4, help="Completions per prompt, num_generations (default 4).")
    p.add_argument("--max-completion-length", type=int, default=192, help="Completion tokens (default 192).")
    p.add_argument("--cpu-threads", type=int, default=1, help="torch threads of the trainer (default 1, mentor's TRL default: "
                   "fastest on a shared 2-core machine, and the hint server shares the cores in the live round).")
    p.add_argument("--hint-max-tokens", type=int, default=256, help="Tokens per hint agent call (judgment: half).")
    p.add_argument("--placement", default="after", choices=("before", "after", "system", "assistant"),
                   help="Where the live hint goes (default after).")
    p.add_argument("--micro-batch", type=int, help="Completions per forward/backward of the loss "
                   "(per_device_train_batch_size; the step's others by gradient accumulation); it must divide "
                   "--prompts-per-step x --group-size (default: all of them, one micro-batch).")
    p.add_argument("--gradient-checkpointing", action="store_true", help="Recompute activations in the backward "
                   "(less memory, more seconds; mentor's CPU default is off).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, help="The policy's sampling temperature, first pass and re-rolls "
                   "(default: TRL's, 1.0; the collapsed set was screened at 0.6).")
    p.add_argument("--modes", default="off,live", help="Rounds to run, comma-separated (default off,live). `live` "
                   "alone still pairs each step's groups before and after their hints (`first_pass_share`), on the "
                   "same policy, at half the machine time.")
    p.add_argument("--port", type=int, default=18124, help="The hint server's port (default 18124).")
    p.add_argument("--work", help="Work folder (resumable; default: bench/live_hints in the mentor cache).")
    p.add_argument("--out", help="The JSON lines file (default: results.jsonl in the work folder).")
    args = p.parse_args(argv)
    for name in ("prompts_per_step", "steps", "group_size", "max_completion_length", "cpu_threads", "hint_max_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.group_size < 2:
        p.error("--group-size must be >= 2 (GRPO compares completions within a group)")
    named = {x.strip() for x in args.modes.split(",") if x.strip()}
    if not named or named - set(MODES):
        p.error(f"--modes {args.modes}: a comma-separated choice of {', '.join(MODES)}")
    args.modes = tuple(m for m in MODES if m in named)
    args.problems = args.problems or args.prompts_per_step * args.steps
    per_step = args.prompts_per_step * args.group_size
    args.micro_batch = args.micro_batch or per_step
    if args.micro_batch < 1 or per_step % args.micro_batch:
        p.error(f"--micro-batch {args.micro_batch}: must divide --prompts-per-step x --group-size ({per_step}), "
                "so that every step is one generation batch")
    if args.problems < args.prompts_per_step:
        p.error(f"--problems {args.problems}: at least --prompts-per-step ({args.prompts_per_step})")
    args.hinter = args.hinter or default_hinter()
    if args.work is None:
        from mentor.pipeline.models import cache_dir

        args.work = str(cache_dir() / "bench" / "live_hints")
    return args


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # SIGTERM unwinds like Ctrl-C: the running `mentor train` is killed and the hint server stopped (finally blocks).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    run(parse_args(sys.argv[1:]))
