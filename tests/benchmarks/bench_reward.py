"""Benchmark of the reward path as OpenRLHF drives it; prints one JSON line.

    python tests/benchmarks/bench_reward.py [--threads 8] [--math 2000] [--code 164]   (--math 0: code checks only)

- math: `reward_func` (the OpenRLHF reward file) called with one sample per
  call from `--threads` threads, on MATH-500 problems: half answered with the
  reference's own text (equal before any parsing, no math worker), half with
  another problem's reference (compared in a math worker), with rollout logging
  on; reports calls/s, the p50/p99 latency (the p50 of that mix is the fastest
  of the worker half: it measures the pool's queue), how many were scored
  correct, and the CPU time per call of this process and of the math workers
  (figures that do not move with the machine's load);
- code: HumanEval canonical solutions (all 164 by default: a phase of ~8 s; one
  of 64 checks lasted ~3 s, too short to compare two versions within 5%) through `verify` (the code reward's
  verifier: a worker and a tester sandbox per check, see docs/sandbox.md), from
  the same number of threads; reports checks/s (``code_runs_per_s``), the p50
  latency, how many passed, and the layers in force.

No target is asserted: the figures show what one trainer process can score
(the verifiers are CPU-bound; on a 2-core shared machine they depend on load,
so the 1-minute load average is printed too). To compare two versions of the
verifier under the same load, run this same script for both (an older copy
starts its math workers differently) in turn with the same arguments, one of
them from a copy of the other's files (``git archive REV | tar -x -C DIR`` plus
a ``mentor`` package of symlinks to its folders on ``PYTHONPATH``), and
interleave the runs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes `pids` have used; 0 for one that is gone."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--math", type=int, default=2000)
    ap.add_argument("--code", type=int, default=164)
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[3] / "shared" / "data"))
    a = ap.parse_args()

    import polars as pl

    from mentor.data import bundled
    from mentor.pipeline.schemas import code_label, prompt_label
    from mentor.training.openrlhf import reward as openrlhf_reward
    from mentor.training.sandbox import run_python
    from mentor.training.verify import math_pool, verify

    os.environ["MENTOR_ROLLOUT_DIR"] = tempfile.mkdtemp(prefix="mentor-bench-reward-")
    answers = pl.read_parquet(bundled("math500_problems.parquet"))["label"].to_list()
    samples = []
    for i in range(a.math):
        ans = answers[i % len(answers)]
        given = ans if i % 2 == 0 else answers[(i + 1) % len(answers)]
        prompt = f"<|im_start|>user\nproblem {i}<|im_end|>\n<|im_start|>assistant\n"
        query = prompt + f"Reasoning... so the answer is $\\boxed{{{given}}}$.<|im_end|>"
        samples.append((query, prompt, prompt_label("math", ans, f"p-{i % len(answers)}", None, 0)))
    pids = []
    if samples:  # (--math 0: the code checks alone, no math worker started)
        workers = math_pool()
        with ThreadPoolExecutor(workers.size) as pool:  # start every worker outside the clock (its import is not counted)
            list(pool.map(lambda _: [workers.check("1", "2") for _ in range(3)], range(workers.size)))
        time.sleep(8.0)  # and let them parse their warm-up shapes while idle
        pids = [w.proc.pid for w in workers._all if w.proc.poll() is None]

    def one(s):
        t = time.perf_counter()
        out = openrlhf_reward.reward_func([s[0]], [s[1]], [s[2]])
        return time.perf_counter() - t, float(out["rewards"][0])

    cpu0, wcpu0 = time.process_time(), _cpu(pids)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.threads) as pool:
        res = list(pool.map(one, samples))
    math_s = time.perf_counter() - t0
    caller_cpu, worker_cpu = time.process_time() - cpu0, _cpu(pids) - wcpu0
    lat = sorted(r[0] for r in res)

    with gzip.open(Path(a.shared) / "humaneval" / "HumanEval.jsonl.gz", "rt") as fh:
        tasks = [json.loads(line) for line in fh][: a.code]
    layers = run_python("pass").layers

    def code(task):
        t = time.perf_counter()
        ok = verify("code", "```python\n" + task["prompt"] + task["canonical_solution"] + "```",
                    code_label(task["test"], task["entry_point"], setup=task["prompt"]))
        return time.perf_counter() - t, ok

    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.threads) as pool:
        cres = list(pool.map(code, tasks))
    code_s = time.perf_counter() - t0
    print(json.dumps({
        "bench": "reward",
        "threads": a.threads,
        "math_calls": len(res),
        "math_calls_per_s": round(len(res) / math_s, 1),
        "math_p50_ms": round(1000 * statistics.median(lat), 2) if lat else None,
        "math_p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 2) if lat else None,
        "math_correct": int(sum(r[1] for r in res)),
        "math_workers": math_pool().size,
        "math_caller_cpu_ms_per_call": round(1000 * caller_cpu / len(res), 3) if res else None,
        "math_worker_cpu_ms_per_call": round(1000 * worker_cpu / len(res), 3) if res else None,
        "math_timeouts": math_pool().timeouts,
        "code_runs": len(cres),
        "code_runs_per_s": round(len(cres) / code_s, 2) if cres else None,
        "code_p50_ms": round(1000 * statistics.median(r[0] for r in cres), 1) if cres else None,
        "code_passed": int(sum(r[1] for r in cres)),
        "sandbox_layers": layers,
        "loadavg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    sys.exit(main())
