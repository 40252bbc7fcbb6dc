"""Contract with the real TRL package: its GRPOTrainer calls mentor's reward on `mentor build` rows (CPU).

1. In this process: TRL's own GRPOTrainer trains one step of a tiny random Llama
   (SmolLM2's tokenizer and chat template) on a GSM8K and a HumanEval prompt row as
   `mentor build` writes them. A spy around mentor's reward keeps what TRL passed;
   the test checks the labels arrived, then scores a correct and a wrong math answer
   and a correct and a wrong HumanEval solution with exactly the keyword arguments
   TRL used (only the completions swapped), and ingests and mines the logged rollouts.
2. Through `mentor train` (kind: trl): the same rows in a round folder, one step in
   the trainer process; the final model, outcome.json and the rollout log.
"""

from __future__ import annotations

import json
import os

import polars as pl
import pytest
import yaml
from click.testing import CliRunner

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.trl

from mentor.workflows.cli import cli  # noqa: E402
from mentor.pipeline.io import write_parquet_atomic  # noqa: E402
from mentor.pipeline.schemas import prompt_label  # noqa: E402
from mentor.stages.build import BUILD, BuildConfig  # noqa: E402
from mentor.training.trl.reward import TrlReward  # noqa: E402

HINT = "h-contract"
GOOD_CODE = ("```python\nfrom typing import List\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
             "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != j)\n```")
BAD_CODE = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    """Row 0 of `mentor build` on GSM8K (its label given a hint id) and on HumanEval, round 1."""
    out = []
    for base in ("gsm8k", "humaneval"):
        d = tmp_path_factory.mktemp(base) / "prompts"
        BUILD({}, BuildConfig(base=base, round=1), d)
        out.append(pl.read_parquet(d / "*.parquet").row(0, named=True))
    lab = json.loads(out[0]["label"])
    out[0]["label"] = prompt_label("math", lab["answer"], lab["problem_id"], HINT, 1)
    out[0]["hint_id"] = HINT
    return out


class Spy(TrlReward):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls: list[dict] = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        return super().__call__(**kwargs)


def _ingest_and_mine(tmp_path, log_dir, name):
    res = CliRunner().invoke(cli, ["ingest", str(log_dir), "--out", str(tmp_path / f"{name}-ro"), "--problems", "gsm8k"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "format: openrlhf" in res.output
    res = CliRunner().invoke(cli, ["mine", str(tmp_path / f"{name}-ro"), "--out", str(tmp_path / f"{name}-mined")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return pl.read_parquet(tmp_path / f"{name}-ro" / "*.parquet"), pl.read_parquet(tmp_path / f"{name}-mined" / "collapsed.parquet")


def test_grpo_trainer_calls_mentor_reward(trainable_llama, rows, tmp_path, monkeypatch, one_thread):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path / "log"))
    tok = AutoTokenizer.from_pretrained(trainable_llama)
    args = GRPOConfig(output_dir=str(tmp_path / "ckpt"), use_cpu=True, bf16=False, gradient_checkpointing=False, num_generations=4,
                      per_device_train_batch_size=8, max_completion_length=16, max_steps=1, report_to="none",
                      save_strategy="no", logging_steps=1, seed=0)
    spy = Spy(tokenizer=tok, max_completion_length=args.max_completion_length)
    data = Dataset.from_list([{"prompt": r["prompt"], "label": r["label"]} for r in rows])
    trainer = GRPOTrainer(model=trainable_llama, reward_funcs=[spy], args=args, train_dataset=data, processing_class=tok)
    trainer.train()

    assert len(spy.calls) == 1
    call = spy.calls[0]
    # What TRL passes: 2 prompts x 4 generations, the label column as a keyword, token ids, the trainer state.
    assert sorted(call["label"]) == sorted([rows[0]["label"]] * 4 + [rows[1]["label"]] * 4)
    assert len(call["prompts"]) == len(call["completions"]) == len(call["completion_ids"]) == 8
    assert call["prompts"][0][-1]["role"] == "user" and call["completions"][0][0]["role"] == "assistant"
    assert isinstance(call["trainer_state"].global_step, int) and callable(call["log_metric"])
    recs = [json.loads(line) for f in (tmp_path / "log").glob("trl-*.jsonl") for line in f.read_text().splitlines()]
    assert [r["step"] for r in recs] == [0] * 8  # the optimizer steps done when the batch was scored

    # The rollouts TRL produced were logged, ingest (no format of their own) and mine.
    df, collapsed = _ingest_and_mine(tmp_path, tmp_path / "log", "train")
    assert df.height == 8 and set(df["round"]) == {1}
    assert df["source"].str.starts_with("trl:").all()
    assert df.filter(pl.col("domain") == "math")["hint_id"].to_list() == [HINT] * 4
    assert df["truncated"].null_count() == 0  # known for every rollout, from TRL's completion ids
    assert df["prompt"].str.contains("<|im_start|>assistant", literal=True).all()  # as the model saw it (chat template)
    # A random model solves nothing: both collapse. Those whose rollouts were mostly cut at max_completion_length (16
    # tokens, from TRL's completion ids) are set apart by mine, not hinted; the rest are hinted.
    stats = json.loads((tmp_path / "train-mined" / "stats.json").read_text())
    cut = df.group_by("problem_id").agg(pl.col("truncated").sum() > pl.len() / 2).get_column("truncated").sum()
    assert df["correct"].sum() == 0 and stats["collapsed"] == 2
    assert stats["cut"] == cut and collapsed.height == 2 - cut

    # The same call with known completions: the right reward for each.
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path / "log2"))
    answer = json.loads(rows[0]["label"])["answer"]
    swapped, want = [], []
    for i, lab in enumerate(call["label"]):
        math = lab == rows[0]["label"]
        good = i % 2 == 0
        text = (f"The answer is \\boxed{{{answer}}}." if good else "The answer is \\boxed{-1}.") if math else (GOOD_CODE if good else BAD_CODE)
        swapped.append([{"role": "assistant", "content": text}])
        want.append(1.0 if good else 0.0)
    assert spy(**(call | {"completions": swapped})) == want
    df2, collapsed2 = _ingest_and_mine(tmp_path, tmp_path / "log2", "swapped")
    assert df2.height == 8 and df2["correct"].sum() == 4 and collapsed2.height == 0


def test_mentor_train_kind_trl_one_step(trainable_llama, rows, tmp_path):
    round_dir = tmp_path / "run" / "round-001"
    prompts = round_dir / "prompts"
    write_parquet_atomic(pl.DataFrame(rows), prompts / "part-00000.parquet", dataset="prompts")
    logs = round_dir / "train" / "logs"
    logs.mkdir(parents=True)
    from mentor.training.rollout_log import run_identity

    run = run_identity(round_dir / "train")
    (logs / f"trl-{run}-stale-1-abc.jsonl").write_text('{"left": "by a killed attempt of this round"}\n')
    (logs / "trl-0123456789ab-other-2-abc.jsonl").write_text('{"left": "by another run sharing the folder"}\n')
    cfg = {"kind": "trl", "round": 1, "round_dir": str(round_dir), "actor_model": trainable_llama, "rollout_log_dir": str(logs),
           "select": "hinted", "max_steps": 1, "per_device_train_batch_size": 4, "max_completion_length": 16,
           "save_strategy": "no", "logging_steps": 1}
    (tmp_path / "round.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["train", "--config", str(tmp_path / "round.yaml")], catch_exceptions=False)
    assert res.exit_code == 0, res.output + (round_dir / "train" / "train.log").read_text()[-3000:]
    outcome = json.loads((round_dir / "train" / "outcome.json").read_text())
    assert outcome["kind"] == "trl" and outcome["exit_code"] == 0 and outcome["steps"] == 1 and outcome["prompts_used"] == 1
    assert outcome["final_model"] == str(round_dir / "train" / "model")
    assert os.path.isfile(os.path.join(outcome["final_model"], "model.safetensors"))
    assert outcome["env"]["OMP_NUM_THREADS"] == "1"
    assert "rewards/mentor_correct/mean" in outcome["metrics"]
    assert (logs / "trl-0123456789ab-other-2-abc.jsonl").is_file()  # another run's shard is never touched
    shards = sorted(logs.glob(f"trl-{run}-*.jsonl"))
    assert len(shards) == 1 and "stale" not in shards[0].name  # the killed attempt's shard is gone
    recs = [json.loads(line) for line in shards[0].read_text().splitlines()]
    assert len(recs) == 4 and {r["hint_id"] for r in recs} == {HINT} and {r["trainer"] for r in recs} == {"trl"}


def test_mentor_train_kind_trl_two_processes(trainable_llama, rows, tmp_path):
    """`num_processes: 2`: accelerate launch starts two CPU processes (torchrun, gloo) through one GRPO step."""
    round_dir = tmp_path / "run" / "round-001"
    write_parquet_atomic(pl.DataFrame(rows), round_dir / "prompts" / "part-00000.parquet", dataset="prompts")
    logs = round_dir / "train" / "logs"
    cfg = {"kind": "trl", "round": 1, "round_dir": str(round_dir), "actor_model": trainable_llama, "rollout_log_dir": str(logs),
           "num_processes": 2, "max_steps": 1, "per_device_train_batch_size": 4, "max_completion_length": 16,
           "save_strategy": "no", "logging_steps": 1}
    (tmp_path / "round.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["train", "--config", str(tmp_path / "round.yaml")], catch_exceptions=False)
    log = (round_dir / "train" / "train.log").read_text()
    assert res.exit_code == 0, res.output + log[-3000:]
    outcome = json.loads((round_dir / "train" / "outcome.json").read_text())
    assert outcome["command"][1:3] == ["-m", "accelerate.commands.launch"] and "--multi_gpu" in outcome["command"]
    assert outcome["exit_code"] == 0 and outcome["steps"] == 1 and outcome["processes"] == 2
    assert os.path.isfile(os.path.join(outcome["final_model"], "model.safetensors"))
    assert "rewards/mentor_correct/mean" in outcome["metrics"]
    # Each process scored its share of the 2 prompts x 4 generations and logged it into its own shard.
    shards = sorted(logs.glob("trl-*.jsonl"))
    recs = [[json.loads(line) for line in f.read_text().splitlines()] for f in shards]
    assert len(shards) == 2 and [len(r) for r in recs] == [4, 4]
    assert len({r[0]["pid"] for r in recs}) == 2
    assert sorted(x["problem_id"] for r in recs for x in r) == sorted([json.loads(rows[0]["label"])["problem_id"]] * 4
                                                                      + [json.loads(rows[1]["label"])["problem_id"]] * 4)
    assert "process 1: done" in log


def test_text_prompts_are_conditioned_on_token_for_token(trainable_llama, tmp_path, monkeypatch, one_thread):
    """Placement assistant: TRL's GRPOTrainer takes build's text prompts as string prompts (no chat template): the
    ids it generates from are the chat template's ids of the open answer, and one GRPO step later the reward got
    the text, scored the continuation and logged the prompt as sent. `mentor train`'s row reader keeps them text."""
    from types import SimpleNamespace

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from mentor.data import bundled
    from mentor.training.trl.launcher import TrlTrainConfig, select_prompts
    from test_build import make_hints

    math = pl.read_parquet(bundled("gsm8k_problems.parquet")).row(0, named=True)
    hint = "Find the eggs left after breakfast and baking first."
    make_hints([{"problem_id": math["problem_id"], "hint": hint, "hint_id": HINT}], tmp_path / "hints.parquet")
    out = tmp_path / "prompts"
    BUILD({}, BuildConfig(base="gsm8k", hints=[str(tmp_path / "hints.parquet")], tokenizer=trainable_llama, answer_template="bare",
                      round=1), out)
    tok = AutoTokenizer.from_pretrained(trainable_llama)
    cfg = TrlTrainConfig(round=1, round_dir=str(tmp_path / "r"), actor_model=trainable_llama, prompts=str(out), select="hinted")
    rows = select_prompts(cfg).to_dicts()
    assert len(rows) == 1 and isinstance(rows[0]["prompt"], str)
    chat = [{"role": "user", "content": f"{math['problem']}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."},
            {"role": "assistant", "content": f"{hint}\n\n"}]
    want = tok.apply_chat_template(chat, continue_final_message=True, return_dict=True)["input_ids"]
    stand_in = SimpleNamespace(processing_class=tok, _is_vlm=False, environment_factories=None, tools=None, chat_template=None,
                               chat_template_kwargs={})
    ids, _, _ = GRPOTrainer._tokenize_prompts(stand_in, [rows[0]["prompt"]])
    assert ids[0] == want  # SmolLM2's tokenizer adds no special tokens of its own

    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path / "log"))
    args = GRPOConfig(output_dir=str(tmp_path / "ckpt"), use_cpu=True, bf16=False, gradient_checkpointing=False, num_generations=4,
                      per_device_train_batch_size=4, max_completion_length=8, max_steps=1, report_to="none",
                      save_strategy="no", logging_steps=1, seed=0)
    spy = Spy(tokenizer=tok, max_completion_length=args.max_completion_length)
    trainer = GRPOTrainer(model=trainable_llama, reward_funcs=[spy], args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    (call,) = spy.calls
    assert call["prompts"] == [rows[0]["prompt"]] * 4 and all(isinstance(c, str) for c in call["completions"])
    assert spy(**(call | {"completions": ["So she makes \\boxed{18}."] * 4})) == [1.0] * 4
    recs = [json.loads(line) for f in (tmp_path / "log").glob("trl-*.jsonl") for line in f.read_text().splitlines()]
    assert len(recs) == 8 and {r["prompt"] for r in recs} == {rows[0]["prompt"]} and {r["hint_id"] for r in recs} == {HINT}
