"""The hint stage through an OpenAI-compatible server against the in-process engine; prints JSON lines.

Same collapsed problems, same hint config and seeds, same model and engine
settings (`mentor serve` starts ``vllm serve`` with the in-process engine's
settings). Each run times `hint_to_dir` alone, the engine already up: the
in-process engine is started (and warmed on other problems) before its timed run,
the server is up and warmed before its own. An idle vLLM CPU engine still spins
on the cores, so the two never live at once: the runs alternate
(server, in-process, server, in-process, ...), ``--repeat`` pairs, and the
median ratio is reported. Goal: server / in-process <= 1.15.

    python tests/benchmarks/bench_server.py [--model M] [--problems 32] [--repeat 2] [--port 8123]

``--floor``: the same server, no in-process engine. Per pair, in turn: the stage as it runs
(each problem's next request sent when its last one is answered, `stages.hint._chains`), the
stage with waves (today's code before the change: every problem's next step in one wave that
waits for its slowest request), and, for each, the engine-bound floor: exactly the requests that
run sent, each problem's in its order, each as soon as the one before it was answered, with no
stage logic between them and no barrier across problems. Goal: stage / floor <= 1.2. The judge
check is off (its one wave is the same in every arm); the problems are the committed 177-problem
GSM8K report set (``--problems`` of them); the server's prefix cache is emptied before every timed
run (``VLLM_SERVER_DEV_MODE=1``'s ``/reset_prefix_cache``).

    python tests/benchmarks/bench_server.py --floor --problems 64 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def collapsed(path: Path) -> Path:
    from mentor.data import bundled
    from mentor.stages.mine import MINE, MineConfig

    MINE({"sources": [str(bundled("gsm8k_rollouts.parquet"))]}, MineConfig(), path)
    return path / "collapsed.parquet"


def timed_hint(src: Path, out: Path, spec, sample: int, skip: int = 0) -> tuple[float, dict]:
    import polars as pl

    from mentor.pipeline.stage import Context
    from mentor.stages.hint import HINT
    from mentor.stages.hint.config import HintConfig

    part = out.with_suffix(".parquet")
    pl.read_parquet(src).sort("problem_id").slice(skip, sample).write_parquet(part)
    t = time.perf_counter()
    st = HINT({"collapsed": [str(part)]}, HintConfig(seed=7), out, Context(backend=spec))
    return time.perf_counter() - t, st.as_dict()


def start_server(model: str | None, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mentor.workflows.cli", "serve", "--port", str(port)] + (["--model", model] if model else [])
    proc = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1", VLLM_SERVER_DEV_MODE="1"))  # dev mode: /reset_prefix_cache
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                return proc
        except OSError:
            time.sleep(2)
    raise SystemExit("the server did not come up")


def reset_cache(port: int) -> None:
    """Empty the server's prefix cache, so a timed run does not reuse the prompts of the one before."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(req, timeout=60):
        pass


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


REPORT_SET = Path(__file__).resolve().parent / "data" / "gsm8k-report-collapsed.parquet"


def recording_backend(served: str, url: str, waves: bool = False):
    """An `OpenAIBackend` that records every request it sends (in send order) and how many were in flight over time
    (``busy``: request-seconds; ``busy / wall`` is the server's mean batch); ``waves``: the stage runs in waves."""
    import threading

    from mentor.pipeline.backends.openai.client import OpenAIBackend

    class Recording(OpenAIBackend):
        def __init__(self) -> None:
            super().__init__(served, url, max_concurrency=64)
            self.sent: list = []
            self.busy = 0.0
            self.completion = 0
            self._mark = threading.Lock()
            if waves:
                self.concurrent = False  # hint_shard then runs waves, as before problems ran side by side

        def _ask(self, req):
            with self._mark:
                self.sent.append(req)
            t = time.perf_counter()
            res = super()._ask(req)
            with self._mark:
                self.busy += time.perf_counter() - t
                self.completion += res.completion_tokens
            return res

    return Recording()


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process (every thread), or of process `pid` and its children (the server)."""
    import psutil

    procs = [psutil.Process(pid)] if pid else [psutil.Process()]
    if pid:
        procs += procs[0].children(recursive=True)
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def timed_stage(src: Path, out: Path, backend, sample: int) -> tuple[float, dict]:
    import polars as pl

    from mentor.pipeline.stage import Context
    from mentor.stages.hint import HINT
    from mentor.stages.hint.config import HintConfig

    part = out.with_suffix(".parquet")
    pl.read_parquet(src).sort("problem_id").head(sample).write_parquet(part)
    cfg = HintConfig(seed=7, judge_check={"enabled": False})
    t = time.perf_counter()
    st = HINT({"collapsed": [str(part)]}, cfg, out, Context(backend=lambda: backend))
    return time.perf_counter() - t, st.as_dict()


def timed_floor(served: str, url: str, sent: list):
    """The recorded requests, each problem's in order, each sent when the one before it is answered; problems side by side.

    Returns the wall time and the replaying backend (its request-seconds and completion tokens)."""
    from concurrent.futures import ThreadPoolExecutor

    chains: dict[str, list] = {}
    for req in sent:
        chains.setdefault(req.id.split(":")[0], []).append(req)
    backend = recording_backend(served, url)

    def run(chain: list) -> None:
        for req in chain:
            backend._ask(req)

    t = time.perf_counter()
    with ThreadPoolExecutor(64) as pool:
        list(pool.map(run, chains.values()))
    return time.perf_counter() - t, backend


def floor_main(args, work: Path) -> None:
    served = args.model or "smollm2-135m"
    url = f"http://127.0.0.1:{args.port}/v1"
    import torch

    server = start_server(args.model, args.port, work / "server.log")
    try:
        warm = recording_backend(served, url, waves=False)
        timed_stage(REPORT_SET, work / "warm", warm, 4)
        for rep in range(args.repeat):
            for arm in args.arms:
                backend = recording_backend(served, url, waves=arm == "waves")
                reset_cache(args.port)
                c0, s0, load0 = cpu_seconds(), cpu_seconds(server.pid), os.getloadavg()[0]
                t_stage, st = timed_stage(REPORT_SET, work / f"{arm}-{rep}", backend, args.problems)
                c1, s1, load1 = cpu_seconds(), cpu_seconds(server.pid), os.getloadavg()[0]
                reset_cache(args.port)
                t_floor, replay = timed_floor(served, url, backend.sent)
                c2, s2, load2 = cpu_seconds(), cpu_seconds(server.pid), os.getloadavg()[0]
                print(json.dumps({"bench": "hint_server_floor", "repeat": rep, "arm": arm, "problems": args.problems,
                                  "model": served, "stage_s": round(t_stage, 1), "floor_s": round(t_floor, 1),
                                  "ratio": round(t_stage / t_floor, 3), "requests": len(backend.sent),
                                  "mean_batch_stage": round(backend.busy / t_stage, 1),
                                  "mean_batch_floor": round(replay.busy / t_floor, 1),
                                  "completion_tokens_stage": backend.completion, "completion_tokens_floor": replay.completion,
                                  "server_cpu_s_stage": round(s1 - s0, 1), "server_cpu_s_floor": round(s2 - s1, 1),
                                  "client_cpu_s_stage": round(c1 - c0, 1), "client_cpu_s_floor": round(c2 - c1, 1),
                                  "failed_calls": st["failed_calls"], "waves": st["waves"], "accepted": st["accepted"],
                                  "repaired": st["repaired"], "fallback": st["fallback"],
                                  "load_1min": [round(x, 1) for x in (load0, load1, load2)],
                                  "cpu": torch.backends.cpu.get_cpu_capability()}), flush=True)
    finally:
        stop(server)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a CPU model name or folder (default: the embedded model)")
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--arms", nargs="+", choices=("chains", "waves"), default=["chains", "waves"],
                    help="with --floor: the stage as it runs (chains) and/or in waves (the code before)")
    ap.add_argument("--floor", action="store_true", help="the stage (problems side by side, and in waves) against the "
                                                          "engine-bound floor of the same requests, on the server alone")
    args = ap.parse_args()
    if args.floor:
        floor_main(args, Path(tempfile.mkdtemp(prefix="mentor-bench-server-floor-")))
        return

    from mentor.pipeline.llm import BackendSpec, hold_engines, release_engines

    served = args.model or "smollm2-135m"
    work = Path(tempfile.mkdtemp(prefix="mentor-bench-server-"))
    src = collapsed(work / "collapsed")
    ratios = []
    for rep in range(args.repeat):
        server = start_server(args.model, args.port, work / "server.log")
        try:
            spec = BackendSpec("openai", served, {"base_url": f"http://127.0.0.1:{args.port}/v1", "max_concurrency": 512})
            timed_hint(src, work / f"warm-server-{rep}", spec, 4, skip=400)
            t_server, st_server = timed_hint(src, work / f"server-{rep}", spec, args.problems)
        finally:
            stop(server)
        spec = BackendSpec("vllm", args.model, {})
        with hold_engines():
            timed_hint(src, work / f"warm-local-{rep}", spec, 4, skip=400)
            t_local, st_local = timed_hint(src, work / f"local-{rep}", spec, args.problems)
        release_engines()
        ratios.append(t_server / t_local)
        print(json.dumps({"bench": "hint_server", "repeat": rep, "problems": args.problems, "model": served,
                          "server_s": round(t_server, 1), "in_process_s": round(t_local, 1), "ratio": round(t_server / t_local, 3),
                          "server_tokens": st_server["completion_tokens"], "in_process_tokens": st_local["completion_tokens"],
                          "server_waves": st_server["waves"], "in_process_waves": st_local["waves"]}), flush=True)
    print(json.dumps({"bench": "hint_server", "median_ratio": round(statistics.median(ratios), 3), "goal": 1.15,
                      "cpu": __import__("torch").backends.cpu.get_cpu_capability()}), flush=True)


if __name__ == "__main__":
    main()
