"""`mentor rollout` and `mentor rescue`: fake-backend unit tests, and one run on the real vLLM CPU engine."""

from __future__ import annotations

import json
import re

import polars as pl
import pyarrow as pa
import pytest
from click.testing import CliRunner

from mentor.data import bundled
from mentor.workflows.cli import cli
from mentor.pipeline.errors import DataError
from mentor.pipeline.io import read_dataset, write_parquet_atomic
from mentor.pipeline.backends.fake import FakeBackend
from mentor.pipeline.llm import GenRequest
from mentor.pipeline.schemas import code_label, prompt_label
from mentor.pipeline.stage import Context
from mentor.stages.rescue import RESCUE
from mentor.stages.rollout import ROLLOUT, RolloutConfig


@pytest.fixture(scope="module")
def gsm8k() -> pl.DataFrame:
    return pl.read_parquet(bundled("gsm8k_problems.parquet"))


def _answer_script(answers: dict[str, str], right: set[str]):
    """Answers correctly for problems whose text is in `right`, wrongly otherwise."""

    def script(req: GenRequest) -> str:
        user = req.messages[-1]["content"]
        for text, ans in answers.items():
            if text in user:
                return f"Let me compute. The answer is \\boxed{{{ans if text in right else ans + '1'}}}."
        return "I am not sure."

    return script


def test_rollout_from_problems(tmp_path, gsm8k):
    probs = gsm8k.head(4)
    src = tmp_path / "problems.parquet"
    write_parquet_atomic(probs, src, dataset="problems")
    answers = dict(zip(probs["problem"], probs["label"]))
    right = set(probs["problem"][:2])
    backend = FakeBackend(_answer_script(answers, right))
    stats = ROLLOUT({"prompts": [str(src)]}, RolloutConfig(k=3, round=5), tmp_path / "out", Context(backend=backend)).as_dict()
    assert backend.calls == 1 and len(backend.log[0]) == 12  # one engine call for all prompts
    assert len({r.seed for r in backend.log[0]}) == 12  # each rollout its own seed
    df = read_dataset([tmp_path / "out"], "rollouts")
    assert df.height == 12 and set(df["source"]) == {"mentor-rollout"} and set(df["round"]) == {5}
    assert df.group_by("problem_id").agg(pl.col("sample_idx").sort()).get_column("sample_idx").to_list() == [[0, 1, 2]] * 4
    per = dict(df.group_by("problem_id").agg(pl.col("correct").sum()).iter_rows())
    assert [per[p] for p in probs["problem_id"]] == [3.0, 3.0, 0.0, 0.0]
    assert stats["collapsed"] == 2 and stats["all_correct"] == 2 and stats["rollouts"] == 12
    # The instruction is appended as in `mentor build`; the problem text is kept without it.
    assert "\\boxed{}" in backend.log[0][0].messages[0]["content"]
    assert df["problem"][0] == probs["problem"][0]


def _prompt_shards(tmp_path, gsm8k) -> tuple[list, dict]:
    rows, answers = [], {}
    for i, r in enumerate(gsm8k.head(3).iter_rows(named=True)):
        answers[r["problem"]] = r["label"]
        for hint_id in (None, "h-1"):  # like build --mode both: one problem, two prompts
            content = (f"Hint: count carefully.\n\n{r['problem']}" if hint_id else r["problem"])
            rows.append({
                "prompt": [{"role": "system", "content": "You are a tutor."}, {"role": "user", "content": content}],
                "label": prompt_label("math", r["label"], r["problem_id"], hint_id, 2),
                "data_source": "gsm8k", "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": r["label"]},
                "extra_info": {"problem_id": r["problem_id"], "hint_id": hint_id, "round": 2, "index": len(rows)},
                "problem_id": r["problem_id"], "hint_id": hint_id, "round": 2,
            })
    shards = [tmp_path / "prompts" / "part-00000.parquet", tmp_path / "prompts" / "part-00001.parquet"]
    write_parquet_atomic(pa.Table.from_pylist(rows[:3]), shards[0], dataset="prompts")
    write_parquet_atomic(pa.Table.from_pylist(rows[3:]), shards[1], dataset="prompts")
    return rows, answers


def test_rollout_from_prompt_shards(tmp_path, gsm8k):
    rows, answers = _prompt_shards(tmp_path, gsm8k)
    backend = FakeBackend(_answer_script(answers, set(answers)))
    stats = ROLLOUT({"prompts": [str(tmp_path / "prompts")]}, RolloutConfig(k=2), tmp_path / "out",
                    Context(backend=backend)).as_dict()
    df = read_dataset([tmp_path / "out"], "rollouts")
    assert df.height == 12 and stats["prompts"] == 6 and stats["problems"] == 3
    assert set(df["round"]) == {2}  # from the label
    assert df.filter(pl.col("hint_id") == "h-1").height == 6
    # Two prompts of one problem: sample_idx stays unique per (problem, round).
    assert df.select("problem_id", "round", "sample_idx").is_unique().all()
    assert backend.log[0][0].messages[0]["role"] == "system"
    assert df["correct"].sum() == 12


def test_rollout_code_problems(tmp_path):
    he = pl.read_parquet(bundled("humaneval_problems.parquet")).head(2)
    src = tmp_path / "he.parquet"
    write_parquet_atomic(he, src, dataset="problems")
    first = he["problem"][0]

    def script(req):
        if first in req.messages[0]["content"]:
            return ("```python\n" + first + "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)"
                    " for j, b in enumerate(numbers) if i != j)\n```")
        return "```python\nimport os\nos.system('echo pwned')\n```"

    ROLLOUT({"prompts": [str(src)]}, RolloutConfig(k=2), tmp_path / "out", Context(backend=FakeBackend(script)))
    df = read_dataset([tmp_path / "out"], "rollouts")
    per = dict(df.group_by("problem_id").agg(pl.col("correct").sum()).iter_rows())
    assert per == {he["problem_id"][0]: 2.0, he["problem_id"][1]: 0.0}
    assert json.loads(df["label"][0])["entry_point"] == "has_close_elements"


def test_rollout_rejects_other_datasets(tmp_path, bundled_rollouts):
    with pytest.raises(DataError, match="neither prompt shards"):
        ROLLOUT({"prompts": [str(bundled_rollouts)]}, RolloutConfig(k=1), tmp_path / "out",
                Context(backend=FakeBackend()))


def _hints(collapsed: pl.DataFrame, n: int) -> pa.Table:
    rows = [
        {"problem_id": pid, "round": 0, "hint_id": f"h-{i}", "hint": "Work out each step's quantity before combining them.",
         "keywords": ["steps"], "status": "accepted", "retries": 0, "refines": 0, "violations": [], "trace": [],
         "model": "fake", "prompt_version": "t", "config_hash": "c"}
        for i, pid in enumerate(collapsed["problem_id"][:n])
    ]
    return pa.Table.from_pylist(rows)


def test_rescue_hinted_vs_unhinted(tmp_path, gsm8k_collapsed):
    collapsed = pl.read_parquet(gsm8k_collapsed)
    small = collapsed.head(5)
    write_parquet_atomic(small, tmp_path / "collapsed.parquet", dataset="collapsed")
    write_parquet_atomic(_hints(small, 4), tmp_path / "hints.parquet", dataset="hints")
    answers = dict(zip(small["problem"], small["label"]))
    # A policy that succeeds only with the hint on the first two problems, never without it.
    lucky = set(small["problem"][:2])

    def script(req):
        user = req.messages[-1]["content"]
        hinted = "\n\nHint: " in user
        for text, ans in answers.items():
            if text in user:
                return f"\\boxed{{{ans}}}" if hinted and text in lucky else "\\boxed{-1}"
        return "?"

    backend = FakeBackend(script)
    summary = RESCUE({"collapsed": [str(tmp_path / "collapsed.parquet")], "arms": {"hinted": [str(tmp_path / "hints.parquet")]}},
                     RolloutConfig(k=3), tmp_path / "rescue", Context(backend=backend)).as_dict()
    assert backend.calls == 1 and len(backend.log[0]) == 4 * 2 * 3
    assert summary["problems"] == 4 and summary["skipped_no_hint"] == 1
    assert summary["rescued_hinted"] == 2 and summary["rescued_unhinted"] == 0
    assert summary["rescue_rate_hinted"] == 0.5 and summary["rescue_rate_unhinted"] == 0.0 and summary["lift"] == 0.5
    rep = pl.read_parquet(tmp_path / "rescue" / "rescue.parquet")
    assert rep.height == 4 and rep["correct_hinted"].to_list() == [3, 3, 0, 0]
    assert rep["rescued_unhinted"].sum() == 0 and rep["hint_id"].to_list() == ["h-0", "h-1", "h-2", "h-3"]
    # The hinted prompt: the hint after the problem in the user message (as `mentor build` lays it out by default).
    hinted = [r for r in backend.log[0] if "\n\nHint: " in r.messages[0]["content"]]
    assert len(hinted) == 12 and hinted[0].messages[0]["content"].startswith(small["problem"][0] + "\n\nHint: ")
    ro = read_dataset([tmp_path / "rescue" / "rollouts"], "rollouts")
    assert ro.height == 24 and ro.select("problem_id", "round", "sample_idx").is_unique().all()
    assert json.loads((tmp_path / "rescue" / "stats.json").read_text())["rescued_hinted"] == 2


def test_rescue_cli_and_errors(tmp_path, gsm8k_collapsed):
    collapsed = pl.read_parquet(gsm8k_collapsed).head(3)
    write_parquet_atomic(collapsed, tmp_path / "c.parquet", dataset="collapsed")
    write_parquet_atomic(_hints(collapsed, 3), tmp_path / "h.parquet", dataset="hints")
    runner = CliRunner()
    res = runner.invoke(cli, ["rescue", "--collapsed", str(tmp_path / "c.parquet"), "--hints", str(tmp_path / "h.parquet"),
                              "--backend", "fake", "--k", "2", "--out", str(tmp_path / "r")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["problems"] == 3 and out["rollouts"] == 12
    # Hints for other problems only: a clear error, no output.
    other = pl.read_parquet(gsm8k_collapsed).slice(10, 2)
    write_parquet_atomic(_hints(other, 2), tmp_path / "h2.parquet", dataset="hints")
    res = runner.invoke(cli, ["rescue", "--collapsed", str(tmp_path / "c.parquet"), "--hints", str(tmp_path / "h2.parquet"),
                              "--backend", "fake", "--out", str(tmp_path / "r2")])
    assert res.exit_code == 1 and "has a hint" in res.output and not (tmp_path / "r2" / "stats.json").exists()
    res = runner.invoke(cli, ["rollout", str(tmp_path / "c.parquet"), "--backend", "fake", "--out", str(tmp_path / "r3"), "--k", "0"])
    assert res.exit_code == 2


# --------------------------------------------------------------------------- real engine


@pytest.mark.vllm
def test_rollout_and_rescue_on_vllm_cpu(tmp_path, gsm8k, gsm8k_collapsed, monkeypatch):
    """One engine start (the backend is cached per process): 3 GSM8K problems, then 2 collapsed ones."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    probs = gsm8k.head(3)
    write_parquet_atomic(probs, tmp_path / "p.parquet", dataset="problems")
    collapsed = pl.read_parquet(gsm8k_collapsed).head(2)
    write_parquet_atomic(collapsed, tmp_path / "c.parquet", dataset="collapsed")
    write_parquet_atomic(_hints(collapsed, 2), tmp_path / "h.parquet", dataset="hints")
    common = ["--k", "2", "--max-tokens", "48", "--max-model-len", "1024", "--seed", "1"]
    runner = CliRunner()
    res = runner.invoke(cli, ["rollout", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "ro"), *common], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output.strip().splitlines()[-1])
    assert stats["rollouts"] == 6 and stats["engine_calls"] == 1 and stats["completion_tokens"] > 0
    df = read_dataset([tmp_path / "ro"], "rollouts")
    assert df.height == 6 and df["response"].str.len_chars().min() > 0
    assert set(df["correct"].unique()) <= {0.0, 1.0}

    res = runner.invoke(cli, ["rescue", "--collapsed", str(tmp_path / "c.parquet"), "--hints", str(tmp_path / "h.parquet"),
                              "--out", str(tmp_path / "rescue"), *common], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "rescue" / "stats.json").read_text())
    assert summary["problems"] == 2 and summary["rollouts"] == 8
    assert 0.0 <= summary["rescue_rate_hinted"] <= 1.0 and 0.0 <= summary["rescue_rate_unhinted"] <= 1.0
    rep = pl.read_parquet(tmp_path / "rescue" / "rescue.parquet")
    assert rep.height == 2 and (rep["correct_hinted"] <= 2).all()
    assert re.match(r".*SmolLM2", summary["model"] or "")
    # the default for a vllm policy: the hint opens the answer, rendered with the policy's chat template and sent as text
    from mentor.pipeline.prompts import ANSWER_TEMPLATES, DEFAULT_ANSWER

    assert summary["arms"]["hinted"]["placement"] == "assistant"
    rolled = pl.read_parquet(tmp_path / "rescue" / "rollouts" / "*.parquet")
    hints = dict(pl.read_parquet(tmp_path / "h.parquet").select("problem_id", "hint").iter_rows())
    for row in rolled.iter_rows(named=True):
        opened = ANSWER_TEMPLATES[DEFAULT_ANSWER].format(hint=hints[row["problem_id"]]) if row["hint_id"] else ""
        assert row["prompt"].startswith("<|im_start|>") and row["prompt"].endswith(f"<|im_start|>assistant\n{opened}")


def test_rollout_engine_failure_names_the_shard_and_a_rerun_redoes_only_the_rest(tmp_path, gsm8k):
    from mentor.pipeline.errors import EngineError

    probs = gsm8k.head(5)
    answers = dict(zip(probs["problem"], probs["label"]))
    victim = probs["problem"][3]  # third shard of 2 prompts
    alive = {"ok": False}

    def script(req):
        if victim in req.messages[0]["content"] and not alive["ok"]:
            raise EngineError("the vLLM engine failed (EngineDeadError after RuntimeError: boom)")
        return _answer_script(answers, set(probs["problem"][:1]))(req)

    cfg = RolloutConfig(k=2, shard_size=2)
    backend = FakeBackend(script)
    with pytest.raises(EngineError, match=r"^rollout: shard 2 of 3 \(2 prompts from .*boom.*rerun the same command"):
        ROLLOUT({"prompts": ["gsm8k"]}, cfg.model_copy(update={"limit": 5}), tmp_path / "out", Context(backend=backend))
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*.parquet")) == ["part-00000.parquet"]
    alive["ok"] = True
    stats = ROLLOUT({"prompts": ["gsm8k"]}, cfg.model_copy(update={"limit": 5}), tmp_path / "out",
                    Context(backend=backend)).as_dict()
    assert stats["shards"] == 3 and stats["shards_reused"] == 1 and stats["engine_calls"] == 2 and stats["rollouts"] == 10
    # The same rows as one uninterrupted run (seeds depend on positions, not on shards).
    fresh = FakeBackend(lambda r: _answer_script(answers, set(probs["problem"][:1]))(r))
    ROLLOUT({"prompts": ["gsm8k"]}, RolloutConfig(k=2, limit=5), tmp_path / "one", Context(backend=fresh))
    assert read_dataset([tmp_path / "out"], "rollouts").equals(read_dataset([tmp_path / "one"], "rollouts"))
    first_run_shard_1, _failed, *second_run = backend.log
    assert [r.seed for r in fresh.log[0]] == [r.seed for batch in (first_run_shard_1, *second_run) for r in batch]


def test_rollout_and_rescue_check_inputs_before_any_engine(tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["rollout", "no-such-set", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "no-such-set: no such file" in res.output
    res = runner.invoke(cli, ["rollout", "gsm8k", "--policy", "qwen2.5-coder-0.5b", "--out", str(tmp_path / "o")],
                        env={"MENTOR_CACHE": str(tmp_path / "empty-cache")})
    assert res.exit_code == 2 and "mentor setup-cpu --model qwen2.5-coder-0.5b" in res.output


def test_rescue_arms_share_problems_and_seeds(tmp_path, gsm8k_collapsed):
    collapsed = pl.read_parquet(gsm8k_collapsed).head(4)
    write_parquet_atomic(collapsed, tmp_path / "c.parquet", dataset="collapsed")
    write_parquet_atomic(_hints(collapsed, 4), tmp_path / "a.parquet", dataset="hints")
    write_parquet_atomic(_hints(collapsed, 3), tmp_path / "b.parquet", dataset="hints")  # no hint for the 4th
    backend = FakeBackend(lambda r: "\\boxed{-1}")
    s = RESCUE({"collapsed": [str(tmp_path / "c.parquet")], "arms": {"full": [str(tmp_path / "a.parquet")], "generic": [str(tmp_path / "b.parquet")]}},
               RolloutConfig(k=2), tmp_path / "r", Context(backend=backend)).as_dict()
    assert s["problems"] == 3 and s["skipped_no_hint"] == 1 and set(s["arms"]) == {"unhinted", "full", "generic"}
    assert s["arms"]["full"]["rescue_rate_ci95"][0] == 0.0 and s["arms"]["full"]["rescue_rate_ci95"][1] > 0.4
    by_arm: dict[str, list[int]] = {}
    for req in backend.log[0]:
        hinted = "\n\nHint: " in req.messages[0]["content"]
        by_arm.setdefault("hinted" if hinted else "unhinted", []).append(req.seed)
    # Rollout j of a problem has the same seed in every arm.
    assert sorted(by_arm["unhinted"] * 2) == sorted(by_arm["hinted"])
    rep = pl.read_parquet(tmp_path / "r" / "rescue.parquet")
    assert {"correct_full", "rescued_generic", "hint_id_full", "mean_correct_unhinted"} <= set(rep.columns)


def test_rescue_takes_a_bundled_problem_set(tmp_path, gsm8k):
    write_parquet_atomic(_hints(gsm8k.head(3), 3), tmp_path / "h.parquet", dataset="hints")
    res = CliRunner().invoke(cli, ["rescue", "--collapsed", "gsm8k", "--hints", str(tmp_path / "h.parquet"), "--backend", "fake",
                                   "--k", "1", "--out", str(tmp_path / "r")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["problems"] == 3 and out["collapsed"] == 1319 and out["skipped_no_hint"] == 1316


def test_rescue_gives_each_arm_its_placement(tmp_path, gsm8k_collapsed, capsys):
    """The same hints under two placements in one run (a placement comparison), and the CLI's --placement."""
    collapsed = pl.read_parquet(gsm8k_collapsed).head(3)
    write_parquet_atomic(collapsed, tmp_path / "c.parquet", dataset="collapsed")
    write_parquet_atomic(_hints(collapsed, 3), tmp_path / "h.parquet", dataset="hints")
    hints = {r["problem_id"]: r["hint"] for r in pl.read_parquet(tmp_path / "h.parquet").iter_rows(named=True)}
    backend = FakeBackend(lambda r: "\\boxed{-1}")
    arms = {"before": [str(tmp_path / "h.parquet")], "after": [str(tmp_path / "h.parquet")], "sys": [str(tmp_path / "h.parquet")]}
    s = RESCUE({"collapsed": [str(tmp_path / "c.parquet")], "arms": arms, "placements": {"before": "before", "sys": "system"}},
               RolloutConfig(k=1), tmp_path / "r", Context(backend=backend, progress=True)).as_dict()
    assert {a: s["arms"][a]["placement"] for a in arms} == {"before": "before", "after": "after", "sys": "system"}
    problems = dict(collapsed.select("problem_id", "problem").iter_rows())
    for req in backend.log[0]:
        user = req.messages[-1]["content"]
        pid = next(p for p, text in problems.items() if text in user)
        kind = ("sys" if req.messages[0]["role"] == "system" else "before" if user.startswith("Hint: ")
                else "after" if f"\n\nHint: {hints[pid]}\n\n" in user else "unhinted")
        if kind == "sys":
            assert req.messages[0]["content"] == f"Hint: {hints[pid]}" and "Hint:" not in user
        assert user.startswith(problems[pid]) == (kind in ("after", "sys", "unhinted"))
    kinds = [("sys" if q.messages[0]["role"] == "system" else "x") for q in backend.log[0]]
    assert kinds.count("sys") == 3 and len(kinds) == 12
    # The progress bar (stderr): every rollout counted once, as the backend tells them and per shard.
    err = capsys.readouterr().err
    assert "rescue: 100%" in err and "12/12" in err and "24/12" not in err
    with pytest.raises(Exception, match="placement for arm"):
        RESCUE({"collapsed": [str(tmp_path / "c.parquet")], "arms": arms, "placements": {"nope": "after"}},
               RolloutConfig(k=1), tmp_path / "r2", Context(backend=backend))
    res = CliRunner().invoke(cli, ["rescue", "--collapsed", str(tmp_path / "c.parquet"), "--hints", str(tmp_path / "h.parquet"),
                                   "--backend", "fake", "--k", "1", "--placement", "before", "--out", str(tmp_path / "r3")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["arms"]["hinted"]["placement"] == "before" and "rescue:" not in res.output  # no bar when stderr is not a terminal
    rolled = pl.read_parquet(tmp_path / "r3" / "rollouts" / "*.parquet").filter(pl.col("hint_id").is_not_null())
    assert rolled.height == 3 and rolled["prompt"].str.starts_with("Hint:").all()


def test_the_default_placement_keeps_earlier_runs_resumable():
    """Outputs made before placements existed keep their keys under --placement before (their layout, then the default)."""
    from mentor.pipeline.prompts import HINT_TEMPLATE
    from mentor.stages.build_render import DEFAULT_PLACEMENT, PLACEMENT_TEMPLATES

    sem = RolloutConfig().semantic()
    assert sem["hint_template"] == PLACEMENT_TEMPLATES[DEFAULT_PLACEMENT] and "placement" not in sem
    assert RolloutConfig(placement="before").semantic()["hint_template"] == HINT_TEMPLATE
    assert RolloutConfig(placement="after").semantic() != RolloutConfig(placement="before").semantic()
    assert RolloutConfig(placement="system").semantic()["placement"] == "system"


def test_the_progress_bar_clock_moves_during_an_engine_call():
    """tqdm redraws only on updates; a shard is one long engine call, so a heartbeat redraws the bar meanwhile."""
    import time

    from mentor.stages.rollout import heartbeat

    class Bar:
        disable, refreshed = False, 0

        def refresh(self):
            self.refreshed += 1

    bar = Bar()
    with heartbeat(bar, every=0.02):
        time.sleep(0.3)
    assert bar.refreshed >= 5
    quiet = Bar()
    quiet.disable = True
    with heartbeat(quiet, every=0.02):
        time.sleep(0.1)
    assert quiet.refreshed == 0
