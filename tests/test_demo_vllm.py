"""`mentor demo` (the README's first command) on the real vLLM CPU engine and the embedded model.

A small sample keeps it to a few minutes on 2 cores. The model's text varies
run to run: only the contract is asserted (counts, schemas, statuses, that
every hint passes the rule checks against its answer, that prompts carry them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import pytest

from mentor.pipeline.prompts import ANSWER_TEMPLATES, DEFAULT_ANSWER
from mentor.stages.rules import check

pytestmark = pytest.mark.vllm


def test_demo_runs_one_round_on_real_rollouts(tmp_path):
    pytest.importorskip("vllm")
    run_dir = tmp_path / "demo"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "mentor.workflows.cli", "demo", "--run-dir", str(run_dir), "--sample", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-4000:]
    stats = json.loads((run_dir / "round-000/collapsed/stats.json").read_text())
    assert stats["collapsed"] == 432 and stats["problems"] == 1319
    hints = pl.read_parquet(run_dir / "round-000/hints/hints.parquet")
    assert hints.height == 2 and set(hints["status"]) <= {"accepted", "repaired", "fallback"}
    collapsed = pl.read_parquet(run_dir / "round-000/collapsed/collapsed.parquet")
    by_id = {r["problem_id"]: r for r in collapsed.iter_rows(named=True)}
    for row in hints.iter_rows(named=True):
        ref = by_id[row["problem_id"]]
        verdict = check(row["hint"], domain="math", answer=ref["label"], problem=ref["problem"])
        assert verdict.ok, (row["hint"], verdict.violations)
    prompts = pl.read_parquet(sorted((run_dir / "round-000/prompts").glob("part-*.parquet")))
    assert prompts.height == 1319
    hinted = prompts.filter(pl.col("hint_id").is_not_null())
    assert sorted(hinted["problem_id"]) == sorted(hints["problem_id"])
    assert prompts.schema["prompt"] == pl.String  # placement assistant (the policy's tokenizer is known): rendered text
    for row in hinted.iter_rows(named=True):
        hint = hints.filter(pl.col("problem_id") == row["problem_id"])["hint"][0]
        opened = ANSWER_TEMPLATES[DEFAULT_ANSWER].format(hint=hint)
        assert row["prompt"].startswith("<|im_start|>") and row["prompt"].endswith(f"<|im_start|>assistant\n{opened}")
    # the judge was checked first, and the run did what the check decided
    hstats = json.loads((run_dir / "round-000/hints/stats.json").read_text())
    jc = hstats["judge_check"]
    assert jc["engine_calls"] == 1 and jc["items"] == 16 and jc["status"] in ("trusted", "untrusted")
    if jc["status"] == "untrusted":
        assert hstats["judge_calls"] == 0 and "cannot tell good hints from bad" in proc.stderr
    # the summary the README promises is printed, with a hint the agents wrote and its trace one command away
    assert "done" in proc.stdout and "0.3275" in proc.stdout
    written = hints.filter(pl.col("status") != "fallback")
    assert written.height >= 1, hints.select("status", "hint").to_dicts()
    shown = next(ln for ln in proc.stdout.splitlines() if ln.startswith("its trace"))
    trace_cmd = shown.split(": ", 1)[1].split()
    assert trace_cmd[:2] == ["mentor", "inspect"] and trace_cmd[-2] == "--problem"
    assert trace_cmd[-1] in written["problem_id"].to_list()
    out_lines = proc.stdout.splitlines()
    at = next(i for i, ln in enumerate(out_lines) if "as the policy sees it" in ln)
    shown_prompt = "\n".join(ln[4:] for ln in out_lines[at + 1:] if ln.startswith("  > "))
    sent = prompts.filter(pl.col("problem_id") == trace_cmd[-1])["prompt"][0]
    assert shown_prompt == "\n".join(sent.splitlines())  # the prompt as the policy sees it, opened answer included
    from click.testing import CliRunner

    from mentor.workflows.cli import cli

    res = CliRunner().invoke(cli, trace_cmd[1:])
    assert res.exit_code == 0 and "trace:" in res.output and "generation" in res.output, res.output
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and "ran 0 stage(s)" in again.stderr
