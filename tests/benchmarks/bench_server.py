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
    from mentor.stages.mine import MineConfig, mine_to_dir

    mine_to_dir([str(bundled("gsm8k_rollouts.parquet"))], path, MineConfig())
    return path / "collapsed.parquet"


def timed_hint(src: Path, out: Path, spec, sample: int, skip: int = 0) -> tuple[float, dict]:
    import polars as pl

    from mentor.stages.hint import hint_to_dir
    from mentor.stages.hint_config import HintConfig

    part = out.with_suffix(".parquet")
    pl.read_parquet(src).sort("problem_id").slice(skip, sample).write_parquet(part)
    t = time.perf_counter()
    st = hint_to_dir(str(part), out, HintConfig(seed=7), spec)
    return time.perf_counter() - t, st.as_dict()


def start_server(model: str | None, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mentor.cli", "serve", "--port", str(port)] + (["--model", model] if model else [])
    proc = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))
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


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a CPU model name or folder (default: the embedded model)")
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--port", type=int, default=8123)
    args = ap.parse_args()

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
