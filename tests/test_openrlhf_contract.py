"""Contract with the real OpenRLHF 0.11.2 package (installed --no-deps, CPU only).

1. Our reward file is loaded and called by OpenRLHF's own `SingleTurnAgentExecutor`
   (its importlib loader, its asyncio.to_thread call, its query decoding), on
   prompts produced by OpenRLHF's own `blending_datasets` + `PromptDataset` from
   our prompt shards, with a real chat tokenizer (the embedded SmolLM2 model's).
   Only the vLLM engine is a stand-in that returns a fixed response.
2. `mentor train --dry-run`'s command is parsed by OpenRLHF's own argument
   parser. `openrlhf.cli.train_ppo_ray` imports ray, vLLM and DeepSpeed at module
   level (GPU-side; importing vLLM alone takes half a minute) and builds its parser
   inside `if __name__ == "__main__"`, so the test executes that block's code from
   the installed source (every statement except the final `train(args)` call):
   the real `add_argument` calls AND the real post-parse validation asserts.
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from copy import deepcopy
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest
import yaml
from click.testing import CliRunner

openrlhf = pytest.importorskip("openrlhf")
pytestmark = pytest.mark.openrlhf

from importlib.metadata import version  # noqa: E402

from mentor.data import bundled  # noqa: E402
from mentor.workflows.cli import cli  # noqa: E402
from mentor.pipeline.io import write_parquet_atomic  # noqa: E402
from mentor.pipeline.schemas import code_label, prompt_label  # noqa: E402
from mentor.training.openrlhf.launcher import REWARD_FILE, TrainConfig, build_command  # noqa: E402


def test_installed_version():
    assert version("openrlhf") == "0.11.2"


# --------------------------------------------------------------------------- reward file


def _prompt_rows() -> list[dict]:
    math = pl.read_parquet(bundled("math500_problems.parquet")).filter(pl.col("label") == r"\frac{14}{3}").row(0, named=True)
    code = pl.read_parquet(bundled("humaneval_problems.parquet")).row(0, named=True)
    rows = []
    for pid, domain, problem, ref, hint_id in (
        (math["problem_id"], "math", math["problem"], math["label"], "h-abc"),
        (code["problem_id"], "code", code["problem"], code["label"], None),
    ):
        user = (f"Hint: think about it.\n\n{problem}" if hint_id else problem)
        rows.append(
            {
                "prompt": [{"role": "user", "content": user}],
                "label": prompt_label(domain, ref, pid, hint_id, 3),
                "data_source": "test",
                "ability": domain,
                "reward_model": {"style": "rule", "ground_truth": ref},
                "extra_info": {"problem_id": pid, "hint_id": hint_id, "round": 3, "index": len(rows)},
                "problem_id": pid,
                "hint_id": hint_id,
                "round": 3,
            }
        )
    return rows


class _Engine:
    """Stands in for OpenRLHF's vLLM actor: returns `text` (+ EOS) as the generation."""

    def __init__(self, tok, text: str, finish: str = "stop") -> None:
        self.tok, self.text, self.finish = tok, text, finish

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        ids = self.tok(self.text, add_special_tokens=False)["input_ids"]
        if self.finish == "stop":
            ids = ids + [self.tok.eos_token_id]
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, text=self.text, finish_reason=self.finish, logprobs=None)])


def test_reward_file_through_single_turn_agent_executor(tokenizer, tmp_path, monkeypatch):
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    log_dir = tmp_path / "rollout-log"
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(log_dir))
    shard = tmp_path / "prompts" / "part-00000.parquet"
    write_parquet_atomic(pa.Table.from_pylist(_prompt_rows()), shard, dataset="prompts")

    args = SimpleNamespace(
        use_ms=False,
        data=SimpleNamespace(input_key="prompt", label_key="label", apply_chat_template=True, image_key="images"),
    )
    strategy = SimpleNamespace(args=args, print=lambda *a, **k: None, is_rank_0=lambda: False)
    data = blending_datasets(str(shard), None, strategy, dataset_split="train")
    dataset = PromptDataset(data, tokenizer, strategy)
    assert len(dataset) == 2
    (_, math_prompt, math_label, _), (_, code_prompt, code_label_, _) = dataset[0], dataset[1]
    assert "Hint: think about it." in math_prompt and json.loads(math_label)["hint_id"] == "h-abc"

    executor = SingleTurnAgentExecutor(remote_rm_url=str(REWARD_FILE))  # loads our file by path
    assert executor.reward_func is not None
    params = SimpleNamespace(max_tokens=256, logprobs=None)
    code_task = pl.read_parquet(bundled("humaneval_problems.parquet")).row(0, named=True)
    good_code = (
        "```python\n" + code_task["problem"] + "    for i, a in enumerate(numbers):\n"
        "        for j, b in enumerate(numbers):\n"
        "            if i != j and abs(a - b) < threshold:\n"
        "                return True\n"
        "    return False\n```"
    )
    cases = [
        (math_prompt, math_label, r"We get $x = \frac{14}{3}$, so the answer is \boxed{\dfrac{14}{3}}.", "stop", 1.0),
        (math_prompt, math_label, r"So the answer is \boxed{5}.", "stop", 0.0),
        (math_prompt, math_label, r"Let me think about x = 5 and", "length", 0.0),
        (code_prompt, code_label_, good_code, "stop", 1.0),
        (code_prompt, code_label_, "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```", "stop", 0.0),
    ]

    async def run_all():
        return await asyncio.gather(
            *[
                executor.execute(p, lab, deepcopy(params), 2048, tokenizer, _Engine(tokenizer, text, finish))
                for p, lab, text, finish, _ in cases
            ]
        )

    outputs = asyncio.run(run_all())
    for out, (_, _, text, finish, want) in zip(outputs, cases):
        assert out["reward"] is not None, text
        assert float(out["reward"].flatten()[0]) == want, text
        assert float(out["scores"].flatten()[0]) == want
        assert out["truncated"] == (finish == "length")
        assert set(out["extra_logs"]) >= {"mentor_correct"}

    # Every rollout was logged; `mentor ingest --format openrlhf` reads them back.
    res = CliRunner().invoke(cli, ["ingest", str(log_dir), "--format", "openrlhf", "--out", str(tmp_path / "ro")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(tmp_path / "ro" / "*.parquet").sort("correct", "response")
    assert df.height == len(cases)
    assert set(df["problem_id"]) == {r["problem_id"] for r in _prompt_rows()}
    assert set(df["round"]) == {3}
    math_rows = df.filter(pl.col("domain") == "math")
    assert set(math_rows["hint_id"]) == {"h-abc"} and math_rows["label"][0] == r"\frac{14}{3}"
    assert sorted(df["correct"].to_list()) == sorted(w for *_, w in cases)
    # Responses are the generated text only (prompt and EOS token removed).
    assert set(df["response"]) == {text for _, _, text, _, _ in cases}
    ended = dict(zip(df["response"], df["truncated"]))
    assert ended[r"Let me think about x = 5 and"] is True  # no end-of-turn token in the query: cut at the limit
    assert ended[r"So the answer is \boxed{5}."] is False
    # Without --problems, the original problem text comes back by id (never the chat-templated prompt with its hint).
    texts = {}
    for name in ("math500_problems.parquet", "humaneval_problems.parquet"):
        texts.update(pl.read_parquet(bundled(name)).select("problem_id", "problem").iter_rows())
    assert all(row["problem"] == texts[row["problem_id"]] for row in df.iter_rows(named=True))
    assert json.loads((tmp_path / "ro" / "stats.json").read_text())["problem_missing"] == 0


def test_reward_func_never_raises():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reward_func", str(REWARD_FILE))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for q, p, lab in (
        (["x"], ["y"], ["not json"]),
        ([None], [None], [None]),
        (["q"], [], []),
        ([12], ["p"], [json.dumps({"domain": "code", "problem_id": "x"})]),
    ):
        out = mod.reward_func(q, p, lab)
        assert float(out["rewards"][0]) == 0.0


# --------------------------------------------------------------------------- the train command


def _run_openrlhf_main_block(argv: list[str]) -> SimpleNamespace:
    """Execute train_ppo_ray's __main__ block (parser + validation) from the installed source, without train()."""
    origin = find_spec("openrlhf.cli.train_ppo_ray").origin
    tree = ast.parse(Path(origin).read_text(), filename=origin)
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    body = [s for s in main.body if not (isinstance(s, ast.Expr) and ast.unparse(s).startswith("train("))]
    assert len(body) == len(main.body) - 1, "expected exactly one train(args) call in the main block"
    import argparse
    import datetime
    import os

    ns = {"argparse": argparse, "datetime": datetime.datetime, "os": os}
    old = sys.argv
    sys.argv = ["train_ppo_ray.py", *argv]
    try:
        exec(compile(ast.Module(body=body, type_ignores=[]), origin, "exec"), ns)
    finally:
        sys.argv = old
    return ns["args"]


def _dry_run_command(tmp_path: Path, extra: dict | None = None, **cfg) -> list[str]:
    conf = {"round": 0, "round_dir": str(tmp_path / "run" / "round-000"), "base_model": "Qwen/Qwen2.5-0.5B-Instruct",
            "actor_gpus_per_node": 2, "ref_gpus_per_node": 2, "vllm_num_engines": 2, **cfg}
    if extra:
        conf["extra_args"] = extra
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump(conf))
    res = CliRunner().invoke(cli, ["train", "--config", str(path), "--dry-run"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    line = [ln for ln in res.output.splitlines() if "openrlhf.cli.train_ppo_ray" in ln][0]
    import shlex

    return shlex.split(line)


def test_dry_run_command_parses_with_openrlhf(tmp_path):
    extra = {"train.batch_size": 16, "rollout.batch_size": 16, "algo.kl.use_loss": True, "algo.kl.estimator": "k3",
             "algo.dynamic_filtering_enable": True, "algo.dynamic_filtering_range": [0, 1], "train.colocate_all": False}
    cmd = _dry_run_command(tmp_path, extra)
    assert cmd[1:3] == ["-m", "openrlhf.cli.train_ppo_ray"]
    args = _run_openrlhf_main_block(cmd[3:])
    assert args.algo.advantage.estimator == "group_norm"
    assert args.rollout.n_samples_per_prompt == 4
    assert args.reward.remote_url == [str(REWARD_FILE)]  # split on commas by OpenRLHF
    assert args.data.input_key == "prompt" and args.data.label_key == "label" and args.data.apply_chat_template
    assert args.actor.model_name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert args.ckpt.path.endswith("round-000/train/ckpt") and args.ckpt.output_dir.endswith("round-000/train/model")
    assert args.train.num_episodes == 1
    assert args.actor.num_gpus_per_node == 2 and args.ref.num_gpus_per_node == 2 and args.vllm.num_engines == 2
    assert args.algo.kl.use_loss and args.algo.kl.estimator == "k3" and args.train.batch_size == 16
    assert args.critic.model_name_or_path is None  # group_norm: no critic


def test_dry_run_prints_environment(tmp_path):
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump({"round_dir": str(tmp_path / "r0"), "base_model": "m"}))
    res = CliRunner().invoke(cli, ["train", "--config", str(path), "--dry-run"])
    assert res.exit_code == 0
    assert f"MENTOR_ROLLOUT_DIR={tmp_path / 'r0' / 'rollouts' / 'log'}" in res.output


def test_openrlhf_rejects_old_flag_names(tmp_path):
    """A pass-through flag from older examples is caught before anything runs (exit 2, OpenRLHF's message)."""
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump({"round_dir": str(tmp_path / "r0"), "base_model": "m",
                                    "extra_args": {"advantage_estimator": "group_norm"}}))
    res = CliRunner().invoke(cli, ["train", "--config", str(path), "--dry-run"])
    assert res.exit_code == 2 and "unrecognized arguments: --advantage_estimator" in res.output
    path.write_text(yaml.safe_dump({"round_dir": str(tmp_path / "r0"), "base_model": "m",
                                    "extra_args": {"algo.advantage.is_correction_enable": True}}))
    res = CliRunner().invoke(cli, ["train", "--config", str(path), "--dry-run"])
    assert res.exit_code == 2 and "is_correction_enable" in res.output


# --------------------------------------------------------------------------- text prompts (placement assistant)


class _Recorder(_Engine):
    """The stand-in actor, keeping the token ids OpenRLHF hands it: what the policy conditions on."""

    def __init__(self, tok, text: str) -> None:
        super().__init__(tok, text)
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.prompts.append(list(prompt_token_ids))
        return await super().generate(prompt_token_ids, sampling_params, multi_modal_data)


def test_text_prompts_reach_the_policy_token_for_token(tokenizer, tmp_path, monkeypatch):
    """Placement assistant: OpenRLHF's blending_datasets + PromptDataset without --data.apply_chat_template take
    build's text as it is, SingleTurnAgentExecutor gives the engine exactly the chat template's ids of the open
    answer (the hint's tokens last, no end of turn), the reward scores the continuation and the log keeps the
    prompt as sent."""
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from mentor.stages.build import BUILD, BuildConfig
    from mentor.training.openrlhf.launcher import openrlhf_data_flags

    math = pl.read_parquet(bundled("gsm8k_problems.parquet")).row(0, named=True)
    hints = tmp_path / "hints.parquet"
    from test_build import make_hints

    hint = "Find the eggs left after breakfast and baking first."
    make_hints([{"problem_id": math["problem_id"], "hint": hint, "hint_id": "h-open"}], hints)
    out = tmp_path / "prompts"
    BUILD({},
          BuildConfig(base="gsm8k", hints=[str(hints)], tokenizer=tokenizer.name_or_path, answer_template="labelled"),
          out)
    flags = openrlhf_data_flags([str(out)])
    assert "--data.apply_chat_template" not in flags
    args = SimpleNamespace(use_ms=False, data=SimpleNamespace(input_key="prompt", label_key="label", apply_chat_template=False,
                                                              image_key="images"))
    strategy = SimpleNamespace(args=args, print=lambda *a, **k: None, is_rank_0=lambda: False)
    dataset = PromptDataset(blending_datasets(str(out), None, strategy, dataset_split="train"), tokenizer, strategy)
    rows = pl.read_parquet(out / "part-*.parquet")
    i = rows["hint_id"].to_list().index("h-open")
    _, prompt, label, _ = dataset[i]
    assert prompt == rows["prompt"][i]  # verbatim
    chat = [{"role": "user", "content": f"{math['problem']}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."},
            {"role": "assistant", "content": f"Hint: {hint}\n\n"}]
    want = tokenizer.apply_chat_template(chat, continue_final_message=True, return_dict=True)["input_ids"]
    hint_ids = tokenizer(f"Hint: {hint}\n\n", add_special_tokens=False)["input_ids"]

    log_dir = tmp_path / "log"
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(log_dir))
    executor = SingleTurnAgentExecutor(remote_rm_url=str(REWARD_FILE))
    engine = _Recorder(tokenizer, "She sells 9 eggs for $2 each, so she makes \\boxed{18}.")
    out_ = asyncio.run(executor.execute(prompt, label, SimpleNamespace(max_tokens=256, logprobs=None), 2048, tokenizer, engine))
    (sent,) = engine.prompts
    assert sent == want and sent[-len(hint_ids):] == hint_ids and tokenizer.eos_token_id not in sent[-len(hint_ids) - 2:]
    assert float(out_["reward"].flatten()[0]) == 1.0
    # unhinted rows: the ids OpenRLHF would have made with its own chat template (--data.apply_chat_template)
    j = rows["hint_id"].to_list().index(None)
    _, plain, plain_label, _ = dataset[j]
    args_ct = SimpleNamespace(use_ms=False, data=SimpleNamespace(input_key="prompt", label_key="label", apply_chat_template=True,
                                                                 image_key="images"))
    own = SimpleNamespace(args=args_ct, print=lambda *a, **k: None, is_rank_0=lambda: False)
    msg_out = tmp_path / "messages"
    BUILD({}, BuildConfig(base="gsm8k", placement="after"), msg_out)
    theirs = PromptDataset(blending_datasets(str(msg_out), None, own, dataset_split="train"), tokenizer, own)
    assert plain == theirs[j][1]
    # with the chat template flag, OpenRLHF would wrap the text in a new user turn: why the flag must go
    wrapped = PromptDataset(blending_datasets(str(out), None, own, dataset_split="train"), tokenizer, own)[i][1]
    assert wrapped != prompt and wrapped.endswith("<|im_start|>assistant\n")
    # the rollout log keeps the prompt as sent (the opened answer included); ingest gives the problem back
    res = CliRunner().invoke(cli, ["ingest", str(log_dir), "--format", "openrlhf", "--out", str(tmp_path / "ro")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    logged = pl.read_parquet(tmp_path / "ro" / "*.parquet").row(0, named=True)
    assert logged["prompt"] == prompt and logged["hint_id"] == "h-open" and logged["correct"] == 1.0
    assert logged["response"] == "She sells 9 eggs for $2 each, so she makes \\boxed{18}." and logged["problem"] == math["problem"]
