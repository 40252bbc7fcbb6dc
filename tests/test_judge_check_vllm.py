"""The judge check on the real vLLM CPU engine (embedded SmolLM2-135M): one `mentor hint` run.

The model's verdicts vary run to run, so nothing asserts what it says; what is asserted
is the contract: one engine call for the whole calibration set, every verdict parsed
(the JSON grammar) and read as the run reads it, the balanced accuracy computed from
those verdicts, and the run doing what the check decided (no judge call when the judge
was not trusted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm

CONFIG = """\
hint:
  max_retry: 1
  max_refine: 1
  max_tokens: {attribution: 120, generation: 160, judgment: 260, repair: 160}
  judge_check: {problems: 3}
"""


def test_the_judge_is_checked_and_the_run_follows_the_verdict(gsm8k_collapsed, tmp_path):
    pytest.importorskip("vllm")
    (tmp_path / "hint.yaml").write_text(CONFIG)
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    r = subprocess.run([sys.executable, "-m", "mentor.workflows.cli", "hint", str(gsm8k_collapsed), "--out", str(tmp_path / "h"),
                        "--sample", "2", "--config", str(tmp_path / "hint.yaml"), "--no-progress"],
                       capture_output=True, text=True, timeout=1500, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    stats = json.loads((tmp_path / "h" / "stats.json").read_text())
    jc = stats["judge_check"]
    report = json.loads((tmp_path / "h" / "judge_check.json").read_text())["report"]
    verdicts = report["verdicts"]
    assert jc["engine_calls"] == 1 and jc["items"] == len(verdicts) == 12 and jc["problems"] == 3
    assert jc["parse_failures"] == 0 and all(v["score"] is not None for v in verdicts), [v["raw"] for v in verdicts]
    for v in verdicts:  # each verdict read as `HintMachine._judged` reads it (threshold 7)
        assert v["accepted"] == (v["correct"] is not False and v["score"] >= 7), v
    good = [v for v in verdicts if v["kind"] == "good"]
    bad = [v for v in verdicts if v["kind"] != "good"]
    tpr = sum(v["accepted"] for v in good) / len(good)
    tnr = sum(not v["accepted"] for v in bad) / len(bad)
    assert jc["balanced_accuracy"] == round((tpr + tnr) / 2, 4)
    assert jc["status"] == ("trusted" if jc["balanced_accuracy"] >= 0.75 else "untrusted")
    # the run did what the check decided, and says so in one line
    if jc["status"] == "untrusted":
        assert jc["action"] == "rules_only" and stats["judge_calls"] == 0 and "judgment" not in stats["requests_by_agent"]
        assert "cannot tell good hints from bad" in r.stderr
    else:
        assert jc["action"] == "judge"
    assert stats["this_run"]["engine_calls"] == stats["engine_calls"] + 1
