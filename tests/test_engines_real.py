"""The hint stage where users run it, with real engines: one vLLM engine per dask worker, and `vllm serve`.

- `mentor hint --workers 2` starts a local cluster of two engine workers; each
  starts one real vLLM CPU engine (the tiny random-weight model) and reuses it for
  its shards, and the two run at once.
- `mentor hint --backend openai` against a real `vllm serve` of the embedded model
  (started by `mentor serve`): every problem gets a status; the server killed
  mid-stage is one clear error and the finished shards are kept; after a restart the
  rerun completes. `mentor rollout` samples the policy through the same server.
- A two-round workflow whose round-1 trainer is a command: no vLLM engine of
  mentor's is alive when it starts, after a round 0 that hinted on the real engine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from tiny_model import make_tiny_llama

pytestmark = pytest.mark.vllm

CONFIG = """\
hint:
  llm_judge: false
  max_retry: 1
  max_refine: 1
  max_tokens: {attribution: 64, generation: 64, judgment: 48, repair: 64}
"""


def _env() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")


def _mentor(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mentor.workflows.cli", *args], capture_output=True, text=True, timeout=timeout, env=_env())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    pytest.importorskip("vllm")
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def config(tmp_path) -> Path:
    (tmp_path / "hint.yaml").write_text(CONFIG)
    return tmp_path / "hint.yaml"


def test_hint_runs_one_engine_per_dask_worker(tiny, gsm8k_collapsed, config, tmp_path):
    out = tmp_path / "hints"
    r = _mentor("hint", str(gsm8k_collapsed), "--out", str(out), "--sample", "8", "--shard-size", "2", "--workers", "2",
                "--model", str(tiny), "--config", str(config), "--no-progress")
    assert r.returncode == 0, r.stderr[-4000:]
    hints = pl.read_parquet(out / "hints.parquet")
    assert hints.height == 8 and set(hints["status"]) <= {"accepted", "repaired", "fallback"}
    ran = json.loads((out / "stats.json").read_text())["shard_runs"]
    assert sorted(s["index"] for s in ran) == [0, 1, 2, 3]
    workers = {s["worker"] for s in ran}
    assert len(workers) == 2 and str(os.getpid()) not in {w.split(":")[1] for w in workers}
    # Each worker started its engine once and reused it for its other shards.
    for w in workers:
        assert sum(s["engine_started"] for s in ran if s["worker"] == w) == 1
    # The two engines ran at once: a shard of one worker overlaps a shard of the other.
    assert any(a["started"] < b["finished"] and b["started"] < a["finished"]
               for a in ran for b in ran if a["worker"] != b["worker"])


# ----------------------------------------------------------------------------- vllm serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mentor serve` of the embedded model in its own process group (killed whole, engine included)."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 600) -> None:
        fh = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "mentor.workflows.cli", "serve", "--port", str(self.port)],
                                     stdout=fh, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited: {self.log.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(2)
        raise AssertionError(f"the server did not come up in {timeout} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)


@pytest.fixture
def server(tmp_path):
    pytest.importorskip("vllm")
    s = Server(_free_port(), tmp_path / "server.log")
    try:
        yield s
    finally:
        s.kill()


def test_hint_through_vllm_serve_survives_a_server_restart(server, gsm8k_collapsed, config, tmp_path):
    server.start()
    out = tmp_path / "hints"
    args = ["hint", str(gsm8k_collapsed), "--out", str(out), "--sample", "8", "--shard-size", "2", "--backend", "openai",
            "--base-url", server.url, "--model", "smollm2-135m", "--config", str(config), "--no-progress"]
    run = subprocess.Popen([sys.executable, "-m", "mentor.workflows.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=_env())
    try:
        deadline = time.monotonic() + 900
        while not list((out / "_shards").glob("_done/*.json")) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert run.poll() is None, "the stage ended before the server could be killed"
        server.kill()  # mid-stage: the first shard is done, the others are not
        stdout, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    err = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(err) == 1 and server.url in err[0] and "rerun" in err[0], stderr[-3000:]
    kept = len(list((out / "_shards").glob("_done/*.json")))
    assert 1 <= kept < 4 and not (out / "hints.parquet").exists()

    server.start()
    r = _mentor(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["this_run"]["shards_reused"] == kept and stats["this_run"]["shards_computed"] == 4 - kept
    assert stats["backend"] == {"kind": "openai", "model": "smollm2-135m", "options": {"structured_output": "response_format"}}
    hints = pl.read_parquet(out / "hints.parquet")
    assert hints.height == 8 and set(hints["status"]) <= {"accepted", "repaired", "fallback"}
    assert stats["requests"] > 8 and stats["completion_tokens"] > 0

    # The policy through the same server: `mentor rollout`.
    r = _mentor("rollout", "gsm8k", "--out", str(tmp_path / "rollouts"), "--limit", "3", "--k", "2", "--max-tokens", "32",
                "--backend", "openai", "--base-url", server.url, "--policy", "smollm2-135m", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = pl.read_parquet(tmp_path / "rollouts" / "*.parquet")
    assert rows.height == 6 and rows["response"].str.len_chars().min() > 0


# ----------------------------------------------------------------------------- no engine left for the trainer

COUNT_ENGINES = """\
import json, sys, psutil
me = psutil.Process()
runner = me.parent()  # the mentor process that launched this trainer command
engines = []
for p in runner.children(recursive=True):
    try:
        title = " ".join(p.cmdline()) or p.name()
    except psutil.NoSuchProcess:
        continue  # gone: not alive
    if p.pid != me.pid and "VLLM::" in title:
        engines.append([p.pid, title])
open(sys.argv[1], "w").write(json.dumps({"engines": engines, "runner": runner.pid}))
sys.exit(3)  # the test needs only the count: end the run here
"""


@pytest.mark.parametrize("workers", [None, 2], ids=["in-process", "dask-workers"])
def test_no_engine_is_alive_when_the_next_round_trains(workers, tiny, tmp_path):
    script = tmp_path / "count_engines.py"
    script.write_text(COUNT_ENGINES)
    seen = tmp_path / "engines.json"
    wf = {
        "name": "engine-handoff", "domain": "math", "base": "gsm8k", "rounds": 2,
        "initial_rollouts": {"source": ["bundled:gsm8k"], "format": "canonical"},
        "trainer": {"kind": "verl", "command": [sys.executable, str(script), str(seen)]},
        "hint": {"backend": {"backend": "vllm", "model": str(tiny), "options": {"max_model_len": 2048}}, "sample": 2,
                 "config": {"llm_judge": False, "max_retry": 0, "max_refine": 0,
                            "max_tokens": {"attribution": 32, "generation": 32, "judgment": 32, "repair": 32}}},
        "build": {"mode": "prefix"},
    }
    import yaml

    (tmp_path / "wf.yaml").write_text(yaml.safe_dump(wf))
    extra = ["--workers", str(workers)] if workers else []
    r = _mentor("run", str(tmp_path / "wf.yaml"), "--run-dir", str(tmp_path / "run"), *extra)
    # Round 0 hinted on the real engine; round 1's trainer command then ended the run.
    hints = pl.read_parquet(tmp_path / "run" / "round-000" / "hints" / "hints.parquet")
    assert hints.height == 2
    assert json.loads((tmp_path / "run" / "round-000" / "hints" / "stats.json").read_text())["shard_runs"][0]["engine_started"]
    assert r.returncode != 0 and seen.exists(), r.stderr[-3000:]
    assert json.loads(seen.read_text())["engines"] == []
