"""Live hints through TRL's real GRPOTrainer (CPU): collapsed groups hinted and re-rolled inside the step.

The policy is a tiny random Llama (SmolLM2's tokenizer and chat template): it solves nothing, so every
group collapses. The hint engine is an in-process fake OpenAI server answering as mentor's fake hint
model (tests/fake_openai_server.py), reached through the real `openai` backend.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import polars as pl
import pytest
import yaml
from click.testing import CliRunner

from fake_openai_server import FakeServer
from live_lib import by_status, check_rerolls, ingest_and_mine

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.trl

from mentor.workflows.cli import cli  # noqa: E402
from mentor.pipeline.errors import ConfigError  # noqa: E402
from mentor.pipeline.io import write_parquet_atomic  # noqa: E402
from mentor.stages.build import BUILD, BuildConfig  # noqa: E402
from mentor.training.trl.launcher import LAUNCHER, grpo_kwargs  # noqa: E402


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    """The first two GSM8K rows as `mentor build` writes them (round 1, unhinted)."""
    d = tmp_path_factory.mktemp("gsm8k") / "prompts"
    BUILD({}, BuildConfig(base="gsm8k", round=1), d)
    return pl.read_parquet(d / "*.parquet").head(2).to_dicts()


def _live(url: str, **over) -> dict:
    return {"backend": {"backend": "openai", "base_url": url, "model": "m"}, "hint": {"max_refine": 0, "max_retry": 0}} | over


def test_config_offline_default_and_refusals(tmp_path):
    base = {"round": 1, "round_dir": str(tmp_path), "actor_model": "x", "max_steps": 1}
    cfg = LAUNCHER.parse(base)
    assert cfg.live_hints is None and "live_hints" not in grpo_kwargs(cfg)  # offline: the GRPOConfig fields as before
    live = LAUNCHER.parse(base | {"live_hints": _live("http://127.0.0.1:9/v1", max_problems_per_step=2, placement="before")})
    assert live.live_hints.placement == "before" and "live_hints" not in grpo_kwargs(live)
    with pytest.raises(ConfigError, match="live_hints.*max_problem"):
        LAUNCHER.parse(base | {"live_hints": _live("http://127.0.0.1:9/v1", max_problem=2)})
    with pytest.raises(ConfigError, match="num_processes 1"):
        LAUNCHER.parse(base | {"num_processes": 2, "live_hints": _live("http://127.0.0.1:9/v1")})
    with pytest.raises(ConfigError, match="base_url"):
        LAUNCHER.parse(base | {"live_hints": {"backend": {"backend": "openai", "model": "m"}}})
    with pytest.raises(ConfigError, match="vouch"):
        LAUNCHER.parse(base | {"live_hints": _live("http://127.0.0.1:9/v1", hint={"vouch": {"samples": 2}})})


def _records(directory) -> list[dict]:
    return [json.loads(line) for f in sorted(directory.glob("trl-*.jsonl")) for line in f.read_text().splitlines()]


def _grpo(trainable_llama, rows, tmp_path, url: str, max_problems_per_step: int, max_steps: int):
    """(TRL's GRPOTrainer on the tiny Llama with mentor's live rollout and reward, the rollout, the tokenizer): groups
    of 4, 8 completions a step, live hints on the hint server at `url`, rollouts logged to tmp_path/log."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from mentor.stages.hint.live import LiveHinter
    from mentor.training.live_hints import LiveHintsConfig
    from mentor.training.trl.live import LiveReward, LiveRollout

    tok = AutoTokenizer.from_pretrained(trainable_llama)
    args = GRPOConfig(output_dir=str(tmp_path / "ckpt"), use_cpu=True, bf16=False, gradient_checkpointing=False, num_generations=4,
                      per_device_train_batch_size=8, max_completion_length=8, max_steps=max_steps, report_to="none",
                      save_strategy="no", logging_steps=1, seed=0)
    data = Dataset.from_list([{"prompt": r["prompt"], "label": r["label"]} for r in rows])
    cfg = LiveHintsConfig.model_validate(_live(url, max_problems_per_step=max_problems_per_step))
    live = LiveRollout(cfg, rows, tok, tmp_path / "log", LiveHinter(cfg))
    trainer = GRPOTrainer(model=trainable_llama, reward_funcs=[LiveReward()], args=args, train_dataset=data, processing_class=tok,
                          rollout_func=live)
    return trainer, live, tok


def test_grpo_trainer_hints_and_rerolls_collapsed_groups(trainable_llama, rows, tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    log_dir = tmp_path / "log"
    with FakeServer() as server:
        trainer, live, tok = _grpo(trainable_llama, rows, tmp_path, server.url, max_problems_per_step=1, max_steps=2)
        trained: list[dict] = []
        score = trainer._generate_and_score_completions
        trainer._generate_and_score_completions = lambda inputs: trained.append(score(inputs)) or trained[-1]
        trainer.train()
        hint_requests = len(server.seen)

    assert len(live.steps) == 2 and hint_requests > 0
    for summary, batch in zip(live.steps, trained):
        # 2 groups, both collapsed (a random policy); the budget hints one, the other goes on unhinted, counted.
        assert summary["groups"] == 2 and summary["collapsed"] == 2 and summary["hinted"] == 1 and summary["over_budget"] == 1
        # What the trainer's loss used as the context: the hinted prompt ids for the hinted group, the plain ones else.
        ids = [row[mask.bool()].tolist() for row, mask in zip(batch["prompt_ids"], batch["prompt_mask"])]
        texts = [tok.decode(i) for i in ids]
        hinted = [i for i, t in enumerate(texts) if "\n\nHint: " in t]
        assert len(hinted) == 4 and hinted == list(range(hinted[0], hinted[0] + 4))  # one whole group
        assert len(set(map(tuple, (ids[i] for i in hinted)))) == 1
        assert texts[hinted[0]].endswith("<|im_start|>assistant\n")  # placement after: a user turn, as build renders it
    assert "mentor/live_hint_seconds" in trainer.state.log_history[0] and "step_time" in trainer.state.log_history[0]

    recs = _records(log_dir)
    assert not list(log_dir.glob(".*.tmp"))
    by = by_status(recs)
    assert {k: len(v) for k, v in by.items()} == {"collapsed_over_budget": 8, "hinted": 8, "rerolled": 8}
    check_rerolls(by)
    assert all(r["step"] in (0, 1) for r in by["rerolled"])
    assert {r["prompt"] for r in by["hinted"]} <= {r["prompt"] for r in by["collapsed_over_budget"]} | set(
        r["prompt"] for r in by["hinted"]) and not any("Hint: " in r["prompt"] for r in by["hinted"])

    # mentor ingest / mine read the live round like any other.
    df = ingest_and_mine(log_dir, tmp_path)
    assert df.height == 24 and df.filter(pl.col("hint_id").is_not_null()).height == 8


def test_every_hinted_group_of_a_step_is_rerolled_in_one_generation(trainable_llama, rows, tmp_path, monkeypatch,
                                                                     one_thread):
    """Two collapsed groups, both hinted: one `_generate_single_turn` call for the first pass and one for both
    re-rolls (it was one per hinted group: 3-4x the first pass's time on the 0.5B), each group's slots holding
    its own hinted prompt, in order."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    with FakeServer() as server:
        trainer, live, tok = _grpo(trainable_llama, rows, tmp_path, server.url, max_problems_per_step=2, max_steps=1)
        calls: list[list[list[int]]] = []
        generate = trainer._generate_single_turn
        trainer._generate_single_turn = lambda ids, *a: calls.append([list(i) for i in ids]) or generate(ids, *a)
        trainer.train()

    assert live.steps[0]["hinted"] == 2
    assert [len(c) for c in calls] == [8, 8]  # the first pass, then both hinted groups together
    rerolls = calls[1]
    assert all(rerolls[i] == rerolls[0] for i in range(4)) and all(rerolls[i] == rerolls[4] for i in range(4, 8))
    assert rerolls[0] != rerolls[4] and all("\n\nHint: " in tok.decode(rerolls[i]) for i in (0, 4))
    assert len(by_status(_records(tmp_path / "log"))["rerolled"]) == 8


def test_a_kill_while_writing_leaves_no_shard(tmp_path):
    """SIGKILL between the temp file and its rename: no shard appears; the next round's start removes the temp file."""
    code = textwrap.dedent(f"""
        import os, signal
        import mentor.training.trl.live as live
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        live.write_shard({str(tmp_path)!r}, [{{"problem_id": "p", "response": "x" * 100000}}] * 50, 3)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not list(tmp_path.glob("*.jsonl")) and len(list(tmp_path.glob(".trl-live-*.tmp"))) == 1
    from mentor.training.trl.live import clear_temp_shards

    assert clear_temp_shards(tmp_path) == 1 and not list(tmp_path.iterdir())


def test_mentor_train_with_live_hints(trainable_llama, rows, tmp_path):
    """`mentor train` (kind trl, live_hints): the trainer process hints through the server; outcome and log show it."""
    round_dir = tmp_path / "run" / "round-001"
    write_parquet_atomic(pl.DataFrame(rows), round_dir / "prompts" / "part-00000.parquet", dataset="prompts")
    logs = round_dir / "train" / "logs"
    with FakeServer() as server:
        cfg = {"kind": "trl", "round": 1, "round_dir": str(round_dir), "actor_model": trainable_llama, "rollout_log_dir": str(logs),
               "max_steps": 1, "per_device_train_batch_size": 8, "max_completion_length": 8, "save_strategy": "no",
               "logging_steps": 1, "live_hints": _live(server.url)}
        (tmp_path / "round.yaml").write_text(yaml.safe_dump(cfg))
        dry = CliRunner().invoke(cli, ["train", "--config", str(tmp_path / "round.yaml"), "--dry-run"], catch_exceptions=False)
        assert dry.exit_code == 0, dry.output
        assert f"# live hints: on: hint engine openai m at {server.url}, placement after" in dry.output
        res = CliRunner().invoke(cli, ["train", "--config", str(tmp_path / "round.yaml")], catch_exceptions=False)
    log = (round_dir / "train" / "train.log").read_text()
    assert res.exit_code == 0, res.output + log[-3000:]
    assert "live hints step 0: 2 group(s), 2 collapsed, 2 hinted and re-rolled" in log
    metrics = json.loads((round_dir / "train" / "metrics.json").read_text())
    assert metrics["live_hints"]["totals"]["hinted"] == 2
    outcome = json.loads((round_dir / "train" / "outcome.json").read_text())
    assert outcome["metrics"]["mentor/live_hinted"] == 2.0
    recs = _records(logs)
    assert len(recs) == 16 and sum(r["live_status"] == "rerolled" for r in recs) == 8


def test_group_pieces_on_build_rows(rows):
    """The problem text of a build row (its instruction stripped), the hinted prompt per placement, labels by prompt."""
    from mentor.pipeline.errors import DataError
    from mentor.pipeline.prompts import INSTRUCTIONS
    from mentor.pipeline.schemas import parse_prompt_label, prompt_label
    from mentor.stages.hint.live import hinted_messages
    from mentor.training.live_hints import LiveHintsConfig, problem_text
    from mentor.training.trl.live import label_index, prompt_key

    row = rows[0]
    problem = problem_text(row["prompt"], "math", dict(INSTRUCTIONS))
    assert problem and problem.startswith("Janet") and not problem.endswith("\\boxed{}.")
    cfg = LiveHintsConfig.model_validate(_live("http://127.0.0.1:9/v1", placement="before"))
    msgs = hinted_messages(cfg, problem, "Count the eggs.", "math", row["prompt"])
    assert msgs == [{"role": "user", "content": f"Hint: Count the eggs.\n\n{problem}\n\n{INSTRUCTIONS['math']}"}]
    system = [{"role": "system", "content": "Be brief."}, *row["prompt"]]
    cfg = LiveHintsConfig.model_validate(_live("http://127.0.0.1:9/v1", placement="assistant"))
    msgs = hinted_messages(cfg, problem, "Count the eggs.", "math", system)
    assert msgs[0] == system[0] and msgs[-1]["role"] == "assistant" and "Count the eggs." in msgs[-1]["content"]

    lab = parse_prompt_label(row["label"])
    same = dict(row, label=prompt_label("math", lab["answer"], "other-id", None, 1))
    assert label_index([row, same])[prompt_key(row["prompt"])] == row["label"]  # the same reference: the first label
    with pytest.raises(DataError, match="same prompt and different references"):
        label_index([row, dict(row, label=prompt_label("math", "999", lab["problem_id"], None, 1))])


def test_live_hints_refused_for_verl_accepted_for_openrlhf(tmp_path):
    from mentor.training.openrlhf.launcher import LAUNCHER as OPENRLHF
    from mentor.training.verl.launcher import LAUNCHER as VERL

    data = {"round": 1, "round_dir": str(tmp_path), "base_model": "x", "live_hints": _live("http://127.0.0.1:9/v1")}
    # verl's agent loop is not wired (no live hook): the error names the field and the trainers that run live hints.
    with pytest.raises(ConfigError, match=r"round.yaml: live_hints: this trainer has no live hints .*: remove live_hints, "
                                          r"or train with kind: openrlhf or kind: trl"):
        VERL.parse(data, "round.yaml", strict=False)
    assert OPENRLHF.parse(data, "round.yaml").live_hints.backend.base_url == "http://127.0.0.1:9/v1"  # mentor.training.openrlhf.live


def test_step_budget_problems_and_seconds(rows):
    """Beyond max_problems_per_step, or once max_seconds_per_step have passed, collapsed groups go on unhinted, counted."""
    from mentor.pipeline.backends.fake import FakeBackend
    from mentor.pipeline.prompts import INSTRUCTIONS
    from mentor.pipeline.schemas import parse_prompt_label
    from mentor.stages.hint.agents import fake_script
    from mentor.stages.hint.live import hint_groups
    from mentor.training.live_hints import LiveHintsConfig, collapsed_row, problem_text

    lab = parse_prompt_label(rows[0]["label"])
    problem = problem_text(rows[0]["prompt"], "math", dict(INSTRUCTIONS))
    collapsed = {k: collapsed_row(f"{lab['problem_id']}-{k}", 1, "math", problem, lab["answer"], ["I do not know."] * 4)
                 for k in range(3)}
    cfg = LiveHintsConfig.model_validate(_live("http://127.0.0.1:9/v1", max_problems_per_step=2, batch=1))
    found = hint_groups(collapsed, cfg, FakeBackend(script=fake_script))
    assert sorted(found.hints) == [0, 1] and found.over_budget == 1 and found.stats["problems"] == 2
    assert all(h["status"] in ("accepted", "repaired", "fallback") and h["hint"] for h in found.hints.values())
    cfg = LiveHintsConfig.model_validate(_live("http://127.0.0.1:9/v1", max_problems_per_step=None, max_seconds_per_step=1e-9))
    found = hint_groups(collapsed, cfg, FakeBackend(script=fake_script))
    assert found.hints == {} and found.over_budget == 3


def test_workflow_trainer_section_takes_live_hints():
    """A workflow's `trainer: {kind: trl, config: {live_hints: ...}}` reaches the TRL round config, checked."""
    from mentor.pipeline.yaml_io import read_yaml_mapping
    from mentor.workflows.config import resolve_workflow_path, validate_workflow

    data = read_yaml_mapping(resolve_workflow_path("gsm8k-loop-cpu"), "workflow")
    data["trainer"].setdefault("config", {})["live_hints"] = _live("http://127.0.0.1:9/v1", max_problems_per_step=2)
    wf = validate_workflow(data, "wf.yaml")
    assert LAUNCHER.parse(wf.trainer.config).live_hints.max_problems_per_step == 2
    data["trainer"]["config"]["live_hints"]["max_problem"] = 3
    with pytest.raises(ConfigError, match="wf.yaml: trainer.config: live_hints.max_problem: unknown key"):
        validate_workflow(data, "wf.yaml")


def test_live_hint_agents_settings_are_checked_by_the_hint_stage(tmp_path):
    """``live_hints.hint`` is the hint stage's to check (`mentor.stages.hint.live.hint_config`): a misspelt key is
    refused naming it, by the trainer's hook before the first step and by the train stage before a round launches."""
    from mentor.stages.hint.live import hint_config
    from mentor.stages.train import TRAIN, TrainConfig, TrainInputs
    from mentor.training.live_hints import LiveHintsConfig

    bad = _live("http://127.0.0.1:9/v1", hint={"max_refin": 1})
    cfg = LiveHintsConfig.model_validate(bad)  # its shape is the trainer config's; the agents' fields are not
    with pytest.raises(ConfigError, match=r"^live_hints: hint.max_refin: unknown key"):
        hint_config(cfg)
    assert hint_config(LiveHintsConfig.model_validate(_live("http://127.0.0.1:9/v1"))).max_refine == 0
    trainer = {"kind": "trl", "config": {"actor_model": "x", "max_steps": 1, "live_hints": bad}}
    for kind, extra in (("trl", {"actor_model": "x", "max_steps": 1}), ("openrlhf", {})):  # `mentor train` too
        round_yaml = tmp_path / f"{kind}.yaml"
        round_yaml.write_text(yaml.safe_dump({"kind": kind, "round": 0, "round_dir": str(tmp_path / kind),
                                              "base_model": "x", "prompts": str(tmp_path), **extra, "live_hints": bad}))
        res = CliRunner().invoke(cli, ["train", "--config", str(round_yaml), "--dry-run"])
        assert res.exit_code != 0 and "live_hints: hint.max_refin: unknown key" in res.output, (kind, res.output)
        assert str(round_yaml) in res.output and "Traceback" not in res.output
    with pytest.raises(ConfigError, match=r"trainer.config.live_hints: hint.max_refin: unknown key"):
        TRAIN.plan(TrainInputs(prompts=str(tmp_path)), TrainConfig(round=1, trainer=trainer), tmp_path / "train")
