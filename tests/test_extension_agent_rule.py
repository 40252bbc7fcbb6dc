"""Issue 60: a hint agent and a hint rule are each added as ONE new file, found from a folder on MENTOR_PLUGIN_PATH.

The toy agent (``agents/toy_focus.py``, role analysis: it runs after attribution) answers
``{"focus": ...}``; its `consume` adds the focus to the problem's keywords, so its answer shows
in the hints (keywords column, and the keyword fallback hint). The toy rule
(``rules/toy_exactly.py``) rejects a hint that says "exactly", which the fake backend's
generation and repair hint always does: every problem ends on the keyword fallback, and
``toy_exactly`` is counted in stats.json and reported by ``mentor check-hint``.
Nothing else is edited: the agent's phase, switch, token limit, state field, counter and fake
answer come from its file; the rule's place in the run order from its ``order`` key.
"""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from toy_plugins import FOCUS, mentor, write_plugins



@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    root = write_plugins(tmp_path_factory.mktemp("plugins"), "agent", "rule")
    return {**os.environ, "MENTOR_PLUGIN_PATH": str(root)}


def test_toy_agent_and_rule_run_through_mentor_hint(plugin_env, gsm8k_collapsed, tmp_path):
    out = tmp_path / "hint"
    r = mentor(plugin_env, "hint", str(gsm8k_collapsed), "--out", str(out), "--backend", "fake", "--sample", "6", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads((out / "stats.json").read_text())
    # the toy agent was asked once per problem, between attribution and generation
    assert stats["requests_by_agent"]["toy_focus"] == 6, stats["requests_by_agent"]
    assert stats["config"]["toy_focus"] is True and stats["config"]["max_tokens"]["toy_focus"] == 64
    assert stats["toy_focus_used"] == 6  # its own counter
    rows = pq.read_table(out / "hints.parquet").to_pylist()
    for row in rows:
        agents = [e["agent"] for e in row["trace"]]
        assert agents[:3] == ["attribution", "toy_focus", "generation"], agents
        toy = row["trace"][1]
        assert json.loads(toy["parsed"]) == {"focus": FOCUS}
        # its answer is used: the focus joins the keywords, which the fallback hint is written from
        assert row["keywords"][-1] == FOCUS
        # the toy rule rejects every candidate ("Work out exactly which quantity ..."): the keyword fallback
        assert "toy_exactly" in row["violations"] and row["status"] == "fallback"
        assert FOCUS in row["hint"] and "exactly" not in row["hint"].lower()
    assert stats["violations"]["toy_exactly"] >= 6
    # the rule runs before special_token (its order key), after the built-in rules
    report = mentor(plugin_env, "check-hint", "Work out exactly what the question asks <|im_end|>", "--answer", "18")
    assert report.returncode == 1, report.stderr[-3000:]
    assert json.loads(report.stdout)["violations"][-2:] == ["toy_exactly", "special_token"]


def test_toy_agent_switch_turns_it_off(plugin_env, gsm8k_collapsed, tmp_path):
    cfg = tmp_path / "hint.yaml"
    cfg.write_text("hint:\n  toy_focus: false\n  max_tokens: {toy_focus: 32}\n")
    out = tmp_path / "hint"
    r = mentor(plugin_env, "hint", str(gsm8k_collapsed), "--out", str(out), "--backend", "fake", "--sample", "2",
               "--no-progress", "--config", str(cfg))
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads((out / "stats.json").read_text())
    assert "toy_focus" not in stats["requests_by_agent"] and stats["requests_by_agent"]["generation"] >= 2
    assert all(FOCUS not in k for row in pq.read_table(out / "hints.parquet").to_pylist() for k in row["keywords"])
