"""Benchmark of the hint stage; prints one JSON line.

(a) orchestration: `hint_shard` over 100,000 collapsed problems (the real GSM8K
    collapsed rows, repeated with distinct ids) with a zero-latency fake
    backend; a quarter of the problems leak the answer once and go through a
    repair, so rules, judgment and repair paths are all exercised. No target:
    real runs are bound by the engine (see (b)).
    Also a floor under the design, over the same rows: only the three
    requests every problem needs (attribution, generation, judgment), each
    built by the agents' message builders into one `GenRequest`, answered by
    the same fake, its JSON decoded, and the rule checks on the one hint --
    no repair, no state machine, no trace, no output table. The stage cannot
    be faster than this. Printed with and without the rule checks, and with
    Python's garbage collector on (as the stage runs) and off.
(b) engine overhead: the hint stage on the real vLLM CPU engine with the
    embedded model over a few problems; its wall time divided by the time of
    raw ``llm.chat`` calls replaying exactly the same prompts and sampling
    parameters wave by wave (prefix cache reset before each, after an untimed
    warm-up run on other problems); --vllm-repeat pairs, median reported, and
    each pair's ratio per completion token too. Target: <= 1.10.

    python tests/benchmarks/bench_hint.py [--problems 100000] [--vllm-problems 4] [--vllm-repeat 3] [--skip-vllm] [--skip-floor]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from types import SimpleNamespace


def collapsed_rows() -> list[dict]:
    from pathlib import Path

    import polars as pl

    from mentor.data import bundled
    from mentor.stages.mine import MINE

    with tempfile.TemporaryDirectory() as d:
        MINE({"sources": [str(bundled("gsm8k_rollouts.parquet"))]}, {}, Path(d) / "c")
        return pl.read_parquet(Path(d) / "c" / "collapsed.parquet").sort("problem_id").to_dicts()


def bench_orchestration(base: list[dict], n: int) -> dict:
    from mentor.pipeline.backends.fake import FakeBackend
    from mentor.pipeline.llm import GenRequest
    from mentor.stages.hint.machine import HintStats, hint_shard
    from mentor.stages.hint.config import HintConfig
    from mentor.stages.hint.agents import fake_script

    rows = [dict(base[i % len(base)], problem_id=f"p-bench-{i:07d}") for i in range(n)]
    leak = '{"hint": "The answer is %s."}'

    def script(req: GenRequest) -> str:
        # A quarter of the problems leak the answer in their first hint, then get repaired.
        if req.id.endswith(":generation:0") and int(req.id.split(":", 1)[0]) % 4 == 0:
            return leak % rows_by_index[int(req.id.split(":", 1)[0])]["label"]
        return fake_script(req)

    rows_by_index = rows
    fake = FakeBackend(script=script, record=False)
    cfg = HintConfig(shard_size=n)
    st = HintStats()
    t0, c0 = time.perf_counter(), time.process_time()
    table = hint_shard(rows, cfg, fake, stats=st)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert table.num_rows == n
    return {
        "a_problems": n,
        "a_seconds": round(dt, 3),
        "a_cpu_seconds": round(cpu, 3),  # less sensitive to other processes on a shared machine
        "a_problems_per_s": round(n / dt),
        "a_problems_per_cpu_s": round(n / cpu),
        "a_requests_per_s": round(st.requests / dt),
        "a_waves": st.waves,
        "a_accepted": st.accepted,
        "a_repaired": st.repaired,
        "a_fallback": st.fallback,
    }


def bench_floor(base: list[dict], n: int) -> dict:
    import gc

    from mentor.pipeline.backends.fake import FakeBackend
    from mentor.pipeline.llm import GenRequest
    from mentor.stages.hint import agents as ha
    from mentor.stages.hint.agent import json_object
    from mentor.stages.hint.config import HintConfig
    from mentor.stages.rules import RuleContext, check_hint

    cfg = HintConfig()
    limits = cfg.for_domain("math")[3]
    t = ha.Templates.load()
    rows = [dict(base[i % len(base)], problem_id=f"p-bench-{i:07d}") for i in range(n)]
    attribution, generation, judgment = ha.ATTRIBUTION, ha.GENERATION, ha.JUDGMENT
    a_schema, h_schema, j_schema = (a.schema(cfg, limits) for a in (attribution, generation, judgment))
    mt = cfg.max_tokens

    def waves() -> tuple[float, float]:
        """Seconds of (the three waves of requests, the rule checks)."""
        fake = FakeBackend(script=ha.fake_script, record=False)
        # what each agent reads of a problem (agents.State), made before the clock starts
        states = [SimpleNamespace(row=r, keywords=[], error=None, retry=0, rejected=[], candidate=None) for r in rows]
        t0 = time.perf_counter()
        res = fake.generate([GenRequest(f"{i}:attribution:0", attribution.messages(s, cfg, t),
                                        mt.attribution, 0.0, 1.0, i, a_schema) for i, s in enumerate(states)])
        for s, x in zip(states, res):
            a = json_object(x.text) or {}
            s.keywords, s.error = a.get("keywords") or [], a.get("error")
        res = fake.generate([GenRequest(f"{i}:generation:0", generation.messages(s, cfg, t),
                                        mt.generation, 0.7, 0.95, i, h_schema) for i, s in enumerate(states)])
        hints = [(json_object(x.text) or {}).get("hint") or "" for x in res]
        t1 = time.perf_counter()
        for r, h in zip(rows, hints):
            check_hint(h, RuleContext(domain="math", answer=r["label"], problem=r["problem"], limits=limits))
        t2 = time.perf_counter()
        for s, h in zip(states, hints):
            s.candidate = h
        res = fake.generate([GenRequest(f"{i}:judgment:0", judgment.messages(s, cfg, t), mt.judgment, 0.0, 1.0, i, j_schema)
                             for i, s in enumerate(states)])
        scores = [json_object(x.text) for x in res]
        assert len(scores) == n
        return (t1 - t0) + (time.perf_counter() - t2), t2 - t1

    req_on, rules_on = waves()
    gc.disable()
    try:
        req_off, rules_off = waves()
    finally:
        gc.enable()
    return {
        "a_floor_requests_per_problem": 3,
        "a_floor_requests_only_problems_per_s": round(n / req_on),
        "a_floor_requests_only_problems_per_s_gc_off": round(n / req_off),
        "a_floor_problems_per_s": round(n / (req_on + rules_on)),
        "a_floor_problems_per_s_gc_off": round(n / (req_off + rules_off)),
    }


def bench_vllm(base: list[dict], n: int, repeat: int = 1) -> dict:
    from mentor.pipeline.llm import GenRequest, make_backend
    from mentor.stages.hint import agents as ha
    from mentor.stages.hint.machine import HintStats, hint_shard
    from mentor.stages.hint.config import HintConfig

    backend = make_backend("vllm", max_model_len=4096)
    waves: list[tuple[list, list, dict | None, float]] = []
    raw_chat = backend.chat

    def timed_chat(conversations, params, chat_template_kwargs=None, on_done=None):
        t = time.perf_counter()
        out = raw_chat(conversations, params, chat_template_kwargs, on_done)
        waves.append((conversations, params, chat_template_kwargs, time.perf_counter() - t))
        return out

    cfg = HintConfig(max_retry=1, max_refine=1,
                     max_tokens={"attribution": 96, "generation": 80, "judgment": 48, "repair": 80})
    # Warm the engine outside both timings: first-call kernels, the grammar of each agent's JSON
    # schema (xgrammar caches compiled grammars per process, so the replay would otherwise get them
    # free), and a whole untimed stage run on other problems, so that neither timed run is the first
    # to meet the engine's batch shapes.
    limits = cfg.for_domain("math")[3]
    schemas = [a.schema(cfg, limits) for a in (ha.ATTRIBUTION, ha.GENERATION, ha.JUDGMENT)]
    backend.generate([GenRequest(f"warm{i}", [{"role": "user", "content": "Say hi."}], max_tokens=2, json_schema=s)
                      for i, s in enumerate(schemas)])
    hint_shard(base[n : 2 * n], cfg, backend, stats=HintStats())
    rows = base[:n]
    runs = []
    for _ in range(repeat):
        waves.clear()
        backend.llm.reset_prefix_cache()
        backend.chat = timed_chat
        st = HintStats()
        t0 = time.perf_counter()
        hint_shard(rows, cfg, backend, stats=st)
        stage = time.perf_counter() - t0
        backend.chat = raw_chat
        in_stage_chat = sum(w[3] for w in waves)
        reset_ok = backend.llm.reset_prefix_cache()  # False would mean the replay ran with a warm prefix cache
        t0 = time.perf_counter()
        replay_tokens = 0
        for conversations, params, template_kwargs, _ in waves:
            for out in raw_chat(conversations, params, template_kwargs):
                replay_tokens += len(out.outputs[0].token_ids) if out.outputs else 0
        replay = time.perf_counter() - t0
        runs.append({
            "stage_s": round(stage, 3),
            "in_stage_chat_s": round(in_stage_chat, 3),
            "replay_chat_s": round(replay, 3),
            "completion_tokens": st.completion_tokens,
            # same prompts and seeds; batch composition can still change a sample's length
            "replay_completion_tokens": replay_tokens,
            "ratio": round(stage / replay, 3),
            "ratio_per_token": round((stage / max(st.completion_tokens, 1)) / (replay / max(replay_tokens, 1)), 3),
            "stage_over_in_stage_chat": round(stage / in_stage_chat, 3),
            "prefix_cache_reset_before_replay": bool(reset_ok),
        })
    ratios = sorted(r["ratio"] for r in runs)
    return {
        "b_problems": n,
        "b_waves": st.waves,
        "b_engine_calls": st.engine_calls,
        "b_requests": st.requests,
        "b_statuses": {"accepted": st.accepted, "repaired": st.repaired, "fallback": st.fallback},
        "b_runs": runs,
        "b_ratio_stage_over_replay": ratios[len(ratios) // 2],  # the median run
        "b_target_ratio": 1.10,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=100_000)
    ap.add_argument("--vllm-problems", type=int, default=4)
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--skip-floor", action="store_true", help="Do not measure the floor of (a).")
    ap.add_argument("--vllm-repeat", type=int, default=3, help="Timed stage + replay pairs (b); the median ratio is reported.")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    base = collapsed_rows()
    out = {"bench": "hint"} | bench_orchestration(base, args.problems)
    if not args.skip_floor:
        out |= bench_floor(base, args.problems)
    if not args.skip_vllm:
        out |= bench_vllm(base, args.vllm_problems, args.vllm_repeat)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    tempfile.tempdir = tempfile.gettempdir()
    main()
    sys.stdout.flush()
    # Skip vLLM's slow teardown once the figures are out, but not its engine process:
    # os._exit runs no atexit hook, so the EngineCore child would outlive us.
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
    os._exit(0)
