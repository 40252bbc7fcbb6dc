"""`mentor hint` on the real vLLM CPU engine with the embedded SmolLM2-135M model.

One engine start for the whole module: a single CLI run (in a subprocess: vLLM
spawns its workers, which needs a real `__main__`) shared by every test.
SmolLM2-135M is a plumbing model and its output varies run to run: nothing
here asserts generated text, only the contract around it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.pipeline.schemas import check_schema

pytestmark = pytest.mark.vllm

N_PROBLEMS = 3
CONFIG = """\
hint:
  max_retry: 1
  max_refine: 1
  max_tokens: {attribution: 120, generation: 96, judgment: 96, repair: 96}
  judge_check: {enabled: false}  # the LLM judge's own path; the check is tests/test_judge_check_vllm.py
"""


def _mentor(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    return subprocess.run([sys.executable, "-m", "mentor.workflows.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def vllm_run(gsm8k_collapsed, tmp_path_factory) -> Path:
    pytest.importorskip("vllm")
    out = tmp_path_factory.mktemp("hint_vllm")
    (out / "hint.yaml").write_text(CONFIG)
    r = _mentor("hint", str(gsm8k_collapsed), "--out", str(out / "hints"), "--sample", str(N_PROBLEMS),
                "--config", str(out / "hint.yaml"), "--seed", "1", "--no-progress")
    assert r.returncode == 0, r.stderr[-4000:]
    (out / "stdout.json").write_text(r.stdout)
    return out


def test_output_schema_and_statuses(vllm_run, gsm8k_collapsed):
    hints = pq.read_table(vllm_run / "hints" / "hints.parquet")
    assert check_schema(hints.schema, "hints") == []
    df = pl.from_arrow(hints)
    expected = pl.read_parquet(gsm8k_collapsed).sort("problem_id").head(N_PROBLEMS)["problem_id"].to_list()
    assert df["problem_id"].to_list() == expected
    assert set(df["status"]) <= {"accepted", "repaired", "fallback"}
    for row in df.iter_rows(named=True):
        assert row["hint"].strip()
        assert row["retries"] <= 1
        assert "SmolLM2-135M-Instruct" in row["model"]
        agents = [e["agent"] for e in row["trace"]]
        assert agents[0] == "attribution"
        # every model call kept its raw text and token counts
        for e in row["trace"]:
            if e["agent"] in ("attribution", "generation", "judgment", "repair"):
                assert e["raw"] is not None and e["completion_tokens"] > 0
                assert e["finish_reason"] in ("stop", "length")
        if row["status"] == "fallback":
            assert agents[-1] == "fallback"
        else:
            assert row["judge_score"] is not None and row["judge_score"] >= 6


def test_every_hint_passes_check_hint(vllm_run, gsm8k_collapsed):
    answers = dict(pl.read_parquet(gsm8k_collapsed).select("problem_id", "label").iter_rows())
    runner = CliRunner()
    for row in pl.read_parquet(vllm_run / "hints" / "hints.parquet").iter_rows(named=True):
        r = runner.invoke(cli, ["check-hint", "--answer", answers[row["problem_id"]], row["hint"]])
        assert r.exit_code == 0, (row["hint"], r.output)
        assert json.loads(r.output) == {"ok": True, "violations": []}


def test_stats_engine_calls_match_waves(vllm_run):
    stats = json.loads((vllm_run / "hints" / "stats.json").read_text())
    assert stats["problems"] == N_PROBLEMS
    assert stats["accepted"] + stats["repaired"] + stats["fallback"] == N_PROBLEMS
    assert stats["engine_calls"] == stats["waves"] >= 3
    assert stats["prompt_tokens"] > 0 and stats["completion_tokens"] > 0
    assert stats["this_run"]["engine_calls"] == stats["engine_calls"]
    assert isinstance(stats["violations"], dict)
    # stdout carries only the JSON summary (vLLM's logs go to stderr)
    assert json.loads((vllm_run / "stdout.json").read_text())["waves"] == stats["waves"]


def test_rerun_makes_no_engine_calls(vllm_run, gsm8k_collapsed):
    before = pq.read_table(vllm_run / "hints" / "hints.parquet")
    r = _mentor("hint", str(gsm8k_collapsed), "--out", str(vllm_run / "hints"), "--sample", str(N_PROBLEMS),
                "--config", str(vllm_run / "hint.yaml"), "--seed", "1", "--no-progress", timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    stats = json.loads((vllm_run / "hints" / "stats.json").read_text())
    assert stats["this_run"] == {"engine_calls": 0, "shards_computed": 0, "shards_reused": 1}
    assert "Starting vLLM" not in r.stderr and "EngineCore" not in r.stderr
    assert pq.read_table(vllm_run / "hints" / "hints.parquet").equals(before)
