"""Live hints in OpenRLHF 0.11.2 (CPU): mentor's agent executor through OpenRLHF's own loading and rollout path.

What is OpenRLHF's own code here: the prompts and labels (`blending_datasets` + `PromptDataset` with the
embedded SmolLM2's chat template, from `mentor build`'s shards), the executor's loading by path
(`vllm_engine._load_agent_executor`), the engine actor's `generate_responses` (n samples of one prompt as
concurrent `execute` calls, `asyncio.gather`) and `generate` (vLLM's `TokensPrompt`, the request loop), and
the experience built from each returned sample (`SamplesGenerator._process_response_into_experience`).
What stands in: the vLLM `AsyncLLMEngine` inside the actor (`actor.llm`): OpenRLHF's engine actor needs a GPU
and a Ray placement group, so a scripted policy answers each token prompt (wrong first, right on a hinted
prompt). The hint engine is a real `openai` backend against mentor's fake hint server (tests/fake_openai_server.py).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import polars as pl
import pytest
from click.testing import CliRunner

from fake_openai_server import FakeServer
from live_lib import by_status, check_rerolls, ingest_and_mine

openrlhf = pytest.importorskip("openrlhf")
pytestmark = pytest.mark.openrlhf

from mentor.workflows.cli import cli  # noqa: E402
from mentor.pipeline.errors import ConfigError  # noqa: E402
from mentor.pipeline.schemas import parse_prompt_label  # noqa: E402
from mentor.stages.build import BUILD, BuildConfig  # noqa: E402
from mentor.training.openrlhf.launcher import LAUNCHER, LIVE_FILE, build_command, build_env  # noqa: E402

N = 4


def _live(url: str, **over) -> dict:
    return {"backend": {"backend": "openai", "base_url": url, "model": "m"}, "hint": {"max_refine": 0, "max_retry": 0}} | over


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three GSM8K prompts as `mentor build` writes them (round 1, unhinted), one shard."""
    out = tmp_path_factory.mktemp("gsm8k") / "prompts"
    BUILD({}, BuildConfig(base="gsm8k", round=1), out / "all")
    rows = pl.read_parquet(out / "all" / "*.parquet").head(3)
    (out / "round").mkdir()
    rows.write_parquet(out / "round" / "part-00000.parquet")
    return out / "round", rows.to_dicts()


def _openrlhf_prompts(shard_dir, tokenizer) -> list[tuple[str, str]]:
    """(prompt, label) as OpenRLHF's own dataset code renders them (`--data.apply_chat_template`)."""
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets

    args = SimpleNamespace(use_ms=False, data=SimpleNamespace(input_key="prompt", label_key="label", apply_chat_template=True,
                                                              image_key="images"))
    strategy = SimpleNamespace(args=args, print=lambda *a, **k: None, is_rank_0=lambda: False)
    data = blending_datasets(str(shard_dir / "part-00000.parquet"), None, strategy, dataset_split="train")
    dataset = PromptDataset(data, tokenizer, strategy)
    return [(dataset[i][1], dataset[i][2]) for i in range(len(dataset))]


class ScriptedPolicy:
    """Stands in for vLLM's AsyncLLMEngine inside OpenRLHF's engine actor (`actor.llm.generate`, an async stream).

    The first prompt's group earns reward (every other sample right); the others are answered wrong, except on a
    hinted prompt, where every other sample is right. Every prompt it saw is kept (token ids)."""

    def __init__(self, tok, rows: list[dict]) -> None:
        self.tok = tok
        self.answers = [(r["prompt"][-1]["content"][:60], parse_prompt_label(r["label"])["answer"]) for r in rows]
        self.calls = 0
        self.seen: list[list[int]] = []

    async def generate(self, prompt, sampling_params, request_id=None):
        ids = list(prompt["prompt_token_ids"])
        self.seen.append(ids)
        text = self.tok.decode(ids)
        which = next(i for i, (head, _) in enumerate(self.answers) if head in text)
        self.calls += 1
        right = self.calls % 2 == 0 and (which == 0 or "Hint: " in text)
        answer = f"So the answer is \\boxed{{{self.answers[which][1]}}}." if right else "I do not know."
        out = self.tok(answer, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        await asyncio.sleep(0)
        yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=out, text=answer, finish_reason="stop",
                                                       logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in out])])


def _actor(executor, policy):
    """OpenRLHF's engine actor class (not started through Ray: its vLLM engine needs a GPU), with the executor
    OpenRLHF loaded and the scripted policy as its engine."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    cls = RolloutRayActor.__ray_metadata__.modified_class
    actor = cls.__new__(cls)
    actor.executor, actor.llm, actor._mm_pad_token_ids = executor, policy, None
    return actor


def _records(directory) -> list[dict]:
    return [json.loads(line) for f in sorted(directory.glob("openrlhf-*.jsonl")) for line in f.read_text().splitlines()]


def test_agent_executor_hints_and_rerolls_collapsed_groups(tokenizer, shards, tmp_path, monkeypatch):
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    from vllm import SamplingParams

    shard_dir, rows = shards
    log_dir = tmp_path / "log"
    prompts = _openrlhf_prompts(shard_dir, tokenizer)
    assert len(prompts) == 3
    with FakeServer() as server:
        cfg = LAUNCHER.parse({"round": 1, "round_dir": str(tmp_path / "r1"), "base_model": "x", "prompts": str(shard_dir),
                              "n_samples_per_prompt": N, "live_hints": _live(server.url, max_problems_per_step=1)})
        for key, value in build_env(cfg).items():  # what `mentor train` hands the engine actors
            if key.startswith("MENTOR_"):
                monkeypatch.setenv(key, value)
        monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(log_dir))
        monkeypatch.setenv("MENTOR_LIVE_STEP_GAP", "0.2")
        executor = _load_agent_executor(str(LIVE_FILE))  # OpenRLHF's own loader: by path, AgentExecutor()
        policy = ScriptedPolicy(tokenizer, rows)
        actor = _actor(executor, policy)
        params = SamplingParams(temperature=1.0, max_tokens=32, min_tokens=1, skip_special_tokens=False, logprobs=1)

        async def step(batch):  # OpenRLHF dispatches every prompt of a batch at once; one actor serves them concurrently
            return await asyncio.gather(*(actor.generate_responses(p, lab, params, 2048, tokenizer, num_samples=N)
                                          for p, lab in batch))

        first = asyncio.run(step(prompts))
        asyncio.run(asyncio.sleep(0.3))  # the engine idles between steps (OpenRLHF trains): the next call starts a step
        second = asyncio.run(step(prompts[1:]))
        asyncio.run(asyncio.sleep(0.3))
        before = len(server.seen)
        params = SamplingParams(temperature=0.6, max_tokens=32, min_tokens=1, skip_special_tokens=False, logprobs=1)
        evaluated = asyncio.run(step(prompts[1:]))  # OpenRLHF's evaluation pass (--eval.temperature): never hinted
        assert len(server.seen) == before
        hint_requests = len(server.seen)

    assert hint_requests > 0
    assert [(s["groups"], s["collapsed"], s["hinted"], s["over_budget"]) for s in executor.steps] == [
        (3, 2, 1, 1), (2, 2, 1, 1), (2, 2, 0, 0)]
    assert executor.steps[2]["evaluation"] == 2 and all("Hint: " not in o["prompt"] for g in evaluated for o in g)
    # The group that earned reward keeps its rollouts: the plain prompt, as generated.
    assert all(o["prompt"] == prompts[0][0] and "Hint: " not in o["prompt"] for o in first[0])
    assert sum(o["reward"] for o in first[0]) > 0
    for batch, plain in ((first[1:], prompts[1:]), (second, prompts[1:])):
        hinted = [g for g in batch if "Hint: " in g[0]["prompt"]]
        kept = [g for g in batch if "Hint: " not in g[0]["prompt"]]
        assert len(hinted) == 1 and len(kept) == 1 and all(o["reward"] == 0 for o in kept[0])
        group = hinted[0]
        assert len({o["prompt"] for o in group}) == 1 and sum(o["reward"] for o in group) > 0  # the re-roll earned reward
        assert all(json.loads(o["label"])["hint_id"] for o in group) and all(o["extra_logs"]["mentor_live_rerolled"] == 1.0 for o in group)
        # What OpenRLHF trains on: the experience's sequence starts with the hinted prompt's ids (one BOS), and the
        # action mask covers the response only.
        hinted_ids = tokenizer(group[0]["prompt"], add_special_tokens=False)["input_ids"]
        for o in group:
            exp = SamplesGenerator._process_response_into_experience(None, o, max_len=2048)
            seq = exp.sequences[0].tolist()
            assert seq[: len(hinted_ids)] == hinted_ids and tokenizer.decode(seq).count("<|im_start|>user") == 1
            assert int(exp.action_mask[0].sum()) == len(seq) - len(hinted_ids)
            assert exp.rollout_log_probs is not None and float(exp.rewards[0]) == o["reward"]
        assert hinted_ids in policy.seen  # the policy was asked to generate from the hinted prompt
        assert group[0]["prompt"].endswith("<|im_start|>assistant\n") and plain[0][0] not in group[0]["prompt"]

    recs = _records(log_dir)
    by = by_status(recs)
    assert {k: len(v) for k, v in by.items()} == {"scored": 4, "hinted": 8, "rerolled": 8, "collapsed_over_budget": 8,
                                                   "collapsed_eval": 8}
    check_rerolls(by)
    assert all(r["trainer"] == "openrlhf" for r in by["rerolled"])
    assert sorted({r["step"] for r in recs}) == [0, 1, 2] and not any("Hint: " in r["prompt"] for r in by["hinted"])

    df = ingest_and_mine(log_dir, tmp_path, "--format", "openrlhf")
    assert df.height == 36 and df.filter(pl.col("hint_id").is_not_null()).height == 8


def test_agent_executor_needs_the_round_settings(monkeypatch):
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    monkeypatch.delenv("MENTOR_LIVE_HINTS", raising=False)
    monkeypatch.delenv("MENTOR_LIVE_TRAINER", raising=False)  # which trainer's hook the entry's file gives: not told
    with pytest.raises(AssertionError, match="Agent module must contain AgentExecutor class"):
        _load_agent_executor(str(LIVE_FILE))
    monkeypatch.setenv("MENTOR_LIVE_TRAINER", LAUNCHER.kind)  # as `mentor train` sets it (build_env)
    with pytest.raises(ConfigError, match="MENTOR_LIVE_HINTS is not set"):
        _load_agent_executor(str(LIVE_FILE))
    monkeypatch.setenv("MENTOR_LIVE_HINTS", json.dumps(_live("http://127.0.0.1:9/v1")))
    monkeypatch.setenv("MENTOR_LIVE_PROMPTS", "/nonexistent/prompts")
    with pytest.raises(ConfigError, match="/nonexistent/prompts: no parquet prompt shards"):
        _load_agent_executor(str(LIVE_FILE))


def test_openrlhf_round_launches_the_executor(tmp_path, shards):
    shard_dir, _ = shards
    base = {"round": 0, "round_dir": str(tmp_path), "base_model": "x", "prompts": str(shard_dir)}
    offline = LAUNCHER.parse(base)
    cmd = build_command(offline)
    assert "--reward.remote_url" in cmd and "--train.agent_func_path" not in cmd
    assert not any(k.startswith("MENTOR_LIVE") for k in build_env(offline))
    cfg = LAUNCHER.parse(base | {"live_hints": _live("http://127.0.0.1:9/v1", max_problems_per_step=2)})
    cmd = build_command(cfg)
    assert cmd[cmd.index("--train.agent_func_path") + 1] == str(LIVE_FILE) and "--reward.remote_url" not in cmd
    env = build_env(cfg)
    assert json.loads(env["MENTOR_LIVE_HINTS"])["max_problems_per_step"] == 2 and env["MENTOR_LIVE_GROUP_SIZE"] == "4"
    assert env["MENTOR_LIVE_TRAINER"] == "openrlhf"  # the entry's file gives OpenRLHF's hook (its AgentExecutor)
    ray_env = json.loads(env["RAY_JOB_CONFIG_JSON_ENV_VAR"])["runtime_env"]["env_vars"]
    assert ray_env["MENTOR_LIVE_PROMPTS"] == cfg.prompt_dataset  # the engine actors get them on every node
    assert ray_env["MENTOR_LIVE_TRAINER"] == "openrlhf"
    (tmp_path / "r.py").write_text("def reward_func(queries, prompts, labels):\n    return None\n")
    with pytest.raises(ConfigError, match="reward_file would not be used"):
        LAUNCHER.parse(base | {"reward_file": str(tmp_path / "r.py"), "live_hints": _live("http://127.0.0.1:9/v1")})
    assert build_env(cfg)["MENTOR_LIVE_TEMPERATURE"] == "1.0"
    with pytest.raises(ConfigError, match="set eval.temperature to another value than rollout.temperature"):
        LAUNCHER.parse(base | {"extra_args": {"eval.dataset": "x", "eval.temperature": 1.0},
                               "live_hints": _live("http://127.0.0.1:9/v1")})
    with pytest.raises(ConfigError, match="train.agent_func_path is set by mentor"):
        build_command(LAUNCHER.parse(base | {"extra_args": {"train.agent_func_path": "x.py"}}))


def test_dry_run_with_live_hints_parses_with_openrlhf(tmp_path, shards, policy_model):
    """`mentor train --dry-run`: the trainer's Python loads the executor; OpenRLHF's own launch code takes the command."""
    import shlex

    import yaml

    from mentor.training.openrlhf.check import check_with_openrlhf

    shard_dir, _ = shards
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump({"round": 0, "round_dir": str(tmp_path / "r0"), "base_model": policy_model,
                                    "prompts": str(shard_dir), "live_hints": _live("http://127.0.0.1:9/v1")}))
    res = CliRunner().invoke(cli, ["train", "--config", str(path), "--dry-run"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"loads the reward {LIVE_FILE}:AgentExecutor" in res.output
    assert "# live hints: on: agent executor stages/hint/live.py (mentor.training.openrlhf.live), hint engine openai m at http://127.0.0.1:9/v1" in res.output
    assert "MENTOR_LIVE_HINTS=" in res.output and "MENTOR_LIVE_GROUP_SIZE=4" in res.output
    cmd = shlex.split([ln for ln in res.output.splitlines() if "openrlhf.cli.train_ppo_ray" in ln][0])
    args, _ = check_with_openrlhf(cmd)
    assert args.train.agent_func_path == str(LIVE_FILE) and args.reward.remote_url == ["agent"]  # OpenRLHF: the executor scores


def test_workflow_openrlhf_trainer_takes_live_hints():
    """A workflow's `trainer: {kind: openrlhf, config: {live_hints: ...}}` reaches the OpenRLHF round config, checked."""
    from mentor.pipeline.yaml_io import read_yaml_mapping
    from mentor.workflows.config import resolve_workflow_path, validate_workflow

    data = read_yaml_mapping(resolve_workflow_path("deepmath-openrlhf"), "workflow")
    data["trainer"].setdefault("config", {})["live_hints"] = _live("http://127.0.0.1:9/v1", max_problems_per_step=2)
    wf = validate_workflow(data, "wf.yaml")
    assert wf.trainer.kind == "openrlhf"
    assert LAUNCHER.parse(wf.trainer.config | {"round_dir": "r", "round": 0}).live_hints.max_problems_per_step == 2
    data["trainer"]["config"]["live_hints"]["max_problem"] = 3
    with pytest.raises(ConfigError, match="wf.yaml: trainer.config: live_hints.max_problem: unknown key"):
        validate_workflow(data, "wf.yaml")


def test_hint_engine_down_the_group_goes_on_unhinted(tokenizer, shards, tmp_path, monkeypatch):
    """No hint server: the collapsed group keeps its rollouts (collapsed_hint_failed, logged); generation goes on."""
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    from vllm import SamplingParams

    shard_dir, rows = shards
    live = _live("http://127.0.0.1:9/v1")
    live["backend"]["options"] = {"max_retries": 1}
    cfg = LAUNCHER.parse({"round": 1, "round_dir": str(tmp_path / "r1"), "base_model": "x", "prompts": str(shard_dir),
                          "n_samples_per_prompt": N, "live_hints": live})
    for key, value in build_env(cfg).items():
        if key.startswith("MENTOR_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path / "log"))
    executor = _load_agent_executor(str(LIVE_FILE))
    actor = _actor(executor, ScriptedPolicy(tokenizer, rows))
    params = SamplingParams(temperature=1.0, max_tokens=32, min_tokens=1, skip_special_tokens=False)
    prompt, label = _openrlhf_prompts(shard_dir, tokenizer)[1]
    out = asyncio.run(actor.generate_responses(prompt, label, params, 2048, tokenizer, num_samples=N))
    assert len(out) == N and all(o["prompt"] == prompt and o["reward"] == 0 for o in out)
    assert executor.steps[-1]["hint_failed"] == 1 and executor.steps[-1]["hinted"] == 0
    assert {r["live_status"] for r in _records(tmp_path / "log")} == {"collapsed_hint_failed"}
