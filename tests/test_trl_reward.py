"""mentor's TRL reward function, called the way TRL 1.16's GRPOTrainer calls it, on `mentor build` rows.

No trl import here (the contract test with the real trainer is test_trl_contract.py):
the keyword arguments are exactly those of ``GRPOTrainer._calculate_rewards``.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.stages.build import BUILD, BuildConfig
from mentor.training.trl.reward import TrlReward, make_reward, reward_func

EOS, PAD = 2, 0


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, dict]:
    """The first prompt row of `mentor build` on the bundled GSM8K and HumanEval sets."""
    out = {}
    for base in ("gsm8k", "humaneval"):
        d = tmp_path_factory.mktemp(base)
        BUILD({}, BuildConfig(base=base, round=2), d / "prompts")
        out[base] = pl.read_parquet(d / "prompts" / "*.parquet").row(0, named=True)
    return out


def _call(reward, row, completions, ids=None, conversational=True, **extra):
    n = len(completions)
    prompt = row["prompt"] if conversational else row["prompt"][-1]["content"]
    comps = [[{"role": "assistant", "content": c}] for c in completions] if conversational else list(completions)
    return reward(prompts=[prompt] * n, completions=comps, completion_ids=ids, label=[row["label"]] * n,
                  trainer_state=type("S", (), {"global_step": 3})(), log_extra=lambda *a: None, log_metric=lambda *a: None, **extra)


def test_math_and_code_rewards_logged_and_ingested(rows, tmp_path, monkeypatch):
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path / "log"))
    reward = make_reward(eos_token_ids=[EOS], max_completion_length=8)
    gsm = rows["gsm8k"]
    answer = json.loads(gsm["label"])["answer"]
    got = _call(reward, gsm, [f"So she makes \\boxed{{{answer}}} dollars.", "\\boxed{17}"], ids=[[5, 6, EOS], [5, 6, 7, 8, 9, 9, 9, 9]])
    assert got == [1.0, 0.0]
    # Plain-text prompts and completions (a non-conversational dataset) score the same.
    assert _call(reward, gsm, [f"\\boxed{{{answer}}}", "\\boxed{3}"], conversational=False) == [1.0, 0.0]

    code = rows["humaneval"]
    good = "```python\nfrom typing import List\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n" \
           "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != j)\n```"
    bad = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    assert _call(reward, code, [good, bad], ids=[[1, EOS], [1, 2, 3, 4, 5, 6, 7, 8]]) == [1.0, 0.0]

    res = CliRunner().invoke(cli, ["ingest", str(tmp_path / "log"), "--out", str(tmp_path / "ro")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "format: openrlhf" in res.output  # TRL logs need no format of their own
    df = pl.read_parquet(tmp_path / "ro" / "*.parquet")
    assert df.height == 6
    assert df["source"].str.starts_with("trl:").all()
    assert set(df["round"]) == {2}
    math_rows = df.filter(pl.col("problem_id") == gsm["problem_id"]).sort("correct")
    assert math_rows.height == 4 and math_rows["correct"].to_list() == [0.0, 0.0, 1.0, 1.0]
    # Truncation follows TRL's rule: the last id is no EOS -> cut at the limit; unknown without ids.
    with_ids = df.filter(pl.col("truncated").is_not_null()).sort("domain", "correct")
    assert with_ids["truncated"].to_list() == [True, False, True, False]
    assert df["truncated"].null_count() == 2
    assert df.filter(pl.col("domain") == "math")["prompt"].str.contains("Please reason step by step").all()

    res = CliRunner().invoke(cli, ["mine", str(tmp_path / "ro"), "--out", str(tmp_path / "mined")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert pl.read_parquet(tmp_path / "mined" / "collapsed.parquet").height == 0  # both problems have a correct rollout


def test_never_raises_and_counts_one_reward_per_completion(rows, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path / "log"))
    gsm = rows["gsm8k"]
    # No label column at all: 0 for every completion, and a warning that says why.
    assert reward_func(prompts=["q", "q"], completions=["\\boxed{18}", "x"]) == [0.0, 0.0]
    assert "no 'label' column" in caplog.text
    # Garbage in every argument: still one float per completion.
    got = reward_func(prompts=None, completions=[None, 42, [{"role": "assistant", "content": None}]], label=["{not json", None])
    assert got == [0.0, 0.0, 0.0]
    assert reward_func(completions=None) == []
    assert reward_func(completions=5) == []
    # A bare answer as label (not mentor's JSON) is still verified as a math answer.
    assert reward_func(prompts=["q"], completions=["\\boxed{18}"], label=["18"]) == [1.0]
    # A failing verifier gives 0 for that completion only.
    class Broken(TrlReward):
        def one(self, prompt, completion, label, ids, step):
            if "boom" in str(completion):
                raise RuntimeError("internal")
            return super().one(prompt, completion, label, ids, step)

    answer = json.loads(gsm["label"])["answer"]
    assert _call(Broken(), gsm, ["boom", f"\\boxed{{{answer}}}"]) == [0.0, 1.0]
    assert "reward failed on completion 0" in caplog.text
