"""The cut is not a collapse: a rollout cut at the response limit is logged as such, and `mentor mine` keeps the
problems that failed mostly at the limit apart from the ones it hints; `mentor status` and `mentor inspect` show
the share with the fix.

Data: the bundled real GSM8K rollouts (4 per problem, 432 of 1,319 problems collapsed), with each response counted
in the Qwen3 tokenizer's tokens against a response limit, as verl's reward file counts a response it gets as text.
"""

from __future__ import annotations

import json
import os

import polars as pl
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.data import bundled

LIMIT = 160  # tokens: about a third of these GSM8K solutions are longer


@pytest.fixture(scope="module")
def cut_rollouts(tmp_path_factory, shared_data):
    """The bundled rollouts, ``truncated`` where the response has at least LIMIT Qwen3 tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "qwen3")
    df = pl.read_parquet(bundled("gsm8k_rollouts.parquet"))
    n = [len(ids) for ids in tok(df["response"].to_list(), add_special_tokens=False)["input_ids"]]
    df = df.with_columns(truncated=pl.Series(n) >= LIMIT)
    path = tmp_path_factory.mktemp("cut") / "rollouts.parquet"
    df.write_parquet(path)
    per = df.group_by("problem_id").agg(max_c=pl.col("correct").max(), cut=pl.col("truncated").sum(), n=pl.len())
    collapsed = per.filter(pl.col("max_c") <= 0)
    expected_cut = set(collapsed.filter(pl.col("cut") > pl.col("n") / 2)["problem_id"])
    return path, set(collapsed["problem_id"]), expected_cut


def test_mine_sets_apart_the_problems_cut_at_the_limit(tmp_path, cut_rollouts):
    path, collapsed, cut = cut_rollouts
    assert len(collapsed) == 432 and 10 < len(cut) < 200
    run = tmp_path / "run"
    out = run / "round-000" / "collapsed"  # where a workflow run keeps its mine stage
    res = CliRunner().invoke(cli, ["mine", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    stats = json.loads((out / "stats.json").read_text())
    assert stats["collapsed"] == 432 and stats["cut"] == len(cut)
    assert abs(stats["cut_share"] - len(cut) / 432) < 1e-6 and "raise the round's response limit" in stats["cut_fix"]
    hinted = set(pl.read_parquet(out / "collapsed.parquet")["problem_id"])
    assert hinted == collapsed - cut  # the hint stage never sees a problem that failed mostly at the limit
    apart = pl.read_ndjson(out / "cut.jsonl")
    assert set(apart["problem_id"]) == cut and (apart["n_cut"] > apart["n_valid"] / 2).all()
    # --cut-share: only problems whose every rollout was cut
    res = CliRunner().invoke(cli, ["mine", str(path), "--out", str(tmp_path / "strict"), "--cut-share", "0.99"])
    assert res.exit_code == 0, res.output
    strict = json.loads((tmp_path / "strict" / "stats.json").read_text())["cut"]
    assert 0 < strict < len(cut)

    # mentor status: the share, and the fix
    (run / "workflow.yaml").write_text("name: cut\n")
    res = CliRunner().invoke(cli, ["status", str(run)])
    assert res.exit_code == 0, res.output
    assert (f"round 0: {len(cut)} of 432 collapsed problems ({len(cut) / 432:.4f}) failed mostly at the response limit "
            "and are not hinted; raise the round's response limit") in res.output


def test_inspect_shows_the_cut_share_and_the_fix(cut_rollouts):
    path, collapsed, cut = cut_rollouts
    res = CliRunner().invoke(cli, ["inspect", str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    body = json.loads(res.output)
    shown = body.get("cut_at_response_limit") or body.get("summary", {}).get("cut_at_response_limit")
    assert shown["collapsed_cut"] == len(cut) and abs(shown["collapsed_cut_share"] - len(cut) / 432) < 1e-5
    assert shown["fix"].startswith("raise the round's response limit")


def test_verls_reward_counts_a_response_against_the_limit_the_launcher_set(tmp_path, shared_data, monkeypatch):
    """verl passes the decoded response only: mentor's reward file counts its tokens against MENTOR_RESPONSE_LIMIT."""
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path))
    monkeypatch.setenv("MENTOR_RUN_ID", "c0ffeec0ffee")
    monkeypatch.setenv("MENTOR_RESPONSE_LIMIT", str(LIMIT))
    monkeypatch.setenv("MENTOR_POLICY_TOKENIZER", str(shared_data / "tokenizers" / "qwen3"))
    from mentor.training.verl.reward import compute_score

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "qwen3")
    df = pl.read_parquet(bundled("gsm8k_rollouts.parquet"))
    long = next(r for r in df.iter_rows(named=True) if len(tok(r["response"])["input_ids"]) > LIMIT)
    # What verl hands the reward for a response its rollout cut at the limit: the first LIMIT tokens, decoded.
    cut = tok.decode(tok(long["response"], add_special_tokens=False)["input_ids"][:LIMIT], skip_special_tokens=True)
    short = "The answer is \\boxed{18}."
    info = {"problem_id": long["problem_id"], "round": 1}
    compute_score("gsm8k", cut, "18", extra_info=info)
    compute_score("gsm8k", short, "18", extra_info=info)
    recs = [json.loads(ln) for f in sorted(tmp_path.glob("verl-c0ffeec0ffee-*.jsonl")) for ln in f.read_text().splitlines()]
    assert [r["truncated"] for r in recs] == [True, False]
    assert [r["correct"] for r in recs][1] == 1.0
    assert os.environ["MENTOR_RESPONSE_LIMIT"] == str(LIMIT)


def test_verl_launcher_hands_the_limit_and_tokenizer_to_the_reward(tmp_path, shared_data):
    pytest.importorskip("verl")
    from mentor.training.verl.launcher import build_env, parse_config

    cfg = parse_config({"kind": "verl", "round": 0, "round_dir": str(tmp_path / "round-000"),
                        "base_model": str(shared_data / "tokenizers" / "qwen3"),
                        "overrides": {"data.max_response_length": 3000}})
    env = build_env(cfg)
    job = json.loads(env["RAY_JOB_CONFIG_JSON_ENV_VAR"])["runtime_env"]["env_vars"]
    assert job["MENTOR_RESPONSE_LIMIT"] == "3000" and job["MENTOR_POLICY_TOKENIZER"] == str(shared_data / "tokenizers" / "qwen3")
