"""`trainer: {kind: verl, config: ...}` and `mentor train` with kind: verl, against the real verl 0.9.1 package.

- The command is checked by verl's own config code: Hydra composes verl's packaged ``ppo_trainer``
  config with the command's own overrides, the round's values are read back, and verl's
  ``validate_config`` runs; its rejections are one-line errors.
- The round's model is verl's own model merger run on an FSDP checkpoint that verl's own
  ``FSDPCheckpointManager`` wrote from two CPU processes (gloo).
- A two-round workflow whose round 1 trains with kind verl: verl's GPU training loop cannot run
  here, so `tests/verl_standin.py` stands in for ``python -m verl.trainer.main_ppo``: verl's own
  ``main`` parses the argv mentor built, verl's reward loader loads mentor's reward file, which
  scores and logs made-up responses, and the checkpoint is verl's (see that file).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
from click.testing import CliRunner

pytest.importorskip("hydra")
pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from mentor.workflows.cli import cli  # noqa: E402
from mentor.pipeline.errors import ConfigError  # noqa: E402
from mentor.stages.build import BUILD, BuildConfig  # noqa: E402
from mentor.training.verl.checkpoints import prepare_logs  # noqa: E402
from mentor.training.verl.hydra import compose  # noqa: E402
from mentor.training.verl.launcher import (  # noqa: E402
    build_command,
    dry_run_text,
    parse_config,
    run_round,
)
from mentor.workflows.config import validate_workflow  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def round_dir(tmp_path_factory):
    """round-000 with `mentor build`'s GSM8K prompts in two shards (700 + 619 rows)."""
    d = tmp_path_factory.mktemp("run") / "round-000"
    BUILD({}, BuildConfig(base="gsm8k", round=0, shard_rows=700), d / "prompts")
    return d


def _yaml(tmp_path, data) -> str:
    p = tmp_path / "round.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def _base(round_dir, **kw):
    return {"kind": "verl", "round": 0, "round_dir": str(round_dir), "base_model": "Qwen/Qwen2.5-1.5B-Instruct",
            "n_gpus_per_node": 8, "overrides": {"data.train_batch_size": 64, "actor_rollout_ref.actor.ppo_mini_batch_size": 32}} | kw


def test_dry_run_checked_by_verls_own_config(tmp_path, round_dir):
    res = CliRunner().invoke(cli, ["train", "--config", _yaml(tmp_path, _base(round_dir)), "--dry-run"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "# GPUs: 8 GPUs (8 shared by actor, rollout, reference" in out
    assert "# verl: [validate_config] All configuration checks passed successfully!" in out
    cmd = shlex.split(next(ln for ln in out.splitlines() if "verl.trainer.main_ppo" in ln))
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    # The printed command, composed again by verl's config: every shard, the GRPO settings, the reward file,
    # the GPUs, the checkpoint folder and the rollout dir for the Ray workers.
    c = compose(cmd[3:])
    shards = sorted(str(p.resolve()) for p in (round_dir / "prompts").glob("part-*.parquet"))
    pad = str(round_dir.resolve() / "train" / "verl-pad.parquet")  # 1,319 prompts in batches of 64: 25 rows repeated
    assert len(shards) == 2 and list(c.data.train_files) == [*shards, pad]
    assert "# batches: 1319 prompts, data.train_batch_size=64 (from the overrides), 21 step(s) per epoch" in out
    assert c.algorithm.adv_estimator == "grpo" and c.actor_rollout_ref.rollout.n == 4
    assert c.actor_rollout_ref.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert c.reward.custom_reward_function.path.endswith("training/verl/reward.py")
    assert c.reward.custom_reward_function.name == "compute_score"
    assert (c.trainer.n_gpus_per_node, c.trainer.nnodes, c.trainer.total_epochs) == (8, 1, 1)
    assert c.trainer.default_local_dir == str(round_dir.resolve() / "train" / "ckpt")
    # The reward workers' variables travel once, in the job config Ray merges into verl's own ray.init;
    # never also under ray_kwargs (Ray refuses a variable set in both).
    job = json.loads(shlex.split(next(ln for ln in out.splitlines() if ln.startswith("export RAY_JOB_CONFIG_JSON_ENV_VAR=")))[1]
                     .split("=", 1)[1])
    env = job["runtime_env"]["env_vars"]
    assert env["MENTOR_ROLLOUT_DIR"] == str(round_dir.resolve() / "rollouts" / "log") and env["MENTOR_ROUND"] == "0"
    assert not [k for k in (c.ray_kwargs.ray_init.get("runtime_env") or {}).get("env_vars", {}) if k.startswith("MENTOR_")]
    assert c.data.train_batch_size == 64 and c.trainer.save_freq > 0
    assert "verl.model_merger merge --backend fsdp" in out


def test_the_prompt_limit_holds_the_longest_hinted_prompt(tmp_path, trainable_llama):
    """verl cuts prompts over data.max_prompt_length (512 unless set); a hinted LiveCodeBench-sized prompt is longer."""
    from transformers import AutoTokenizer

    d = tmp_path / "round-001"
    hints = tmp_path / "hints.parquet"
    from mentor.data import bundled
    from test_build import make_hints

    ids = pl.read_parquet(bundled("humaneval_problems.parquet"))["problem_id"]
    make_hints([{"problem_id": i, "hint": "Consider every branch of the input before you return. " * 40}
                for i in ids.head(20).to_list()], hints)
    BUILD({}, BuildConfig(base="humaneval", hints=[str(hints)], round=1), d / "prompts")
    tok = AutoTokenizer.from_pretrained(trainable_llama)
    prompts = pl.read_parquet(d / "prompts" / "*.parquet")["prompt"].to_list()
    want = max(len(tok(tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
                   ["input_ids"]) for p in prompts)
    assert want > 512  # verl's default would have cut these
    cfg = parse_config(_base(d, base_model=str(trainable_llama), round=0))
    out = dry_run_text(cfg)
    cmd = shlex.split(next(ln for ln in out.splitlines() if "verl.trainer.main_ppo" in ln))
    from mentor.training.prompt_limits import prompt_room

    assert compose(cmd[3:]).data.max_prompt_length == prompt_room(want) > want  # what main_ppo's own Hydra reads, with the margin
    assert f"# longest prompt: {want} tokens ({trainable_llama}, {len(prompts)} prompts, measured)" in out
    # A limit the user set below it: refused with both numbers, before anything starts.
    low = parse_config(_base(d, base_model=str(trainable_llama), overrides={"data.max_prompt_length": 512, "data.train_batch_size": 64,
                                                                       "actor_rollout_ref.actor.ppo_mini_batch_size": 32}))
    with pytest.raises(ConfigError, match=rf"longest prompt is {want} tokens .* over data.max_prompt_length=512"):
        dry_run_text(low)
    assert not (d / "train").exists()


def test_paths_hydra_would_misread_survive(tmp_path):
    d = tmp_path / "it's a ${run},[x]=y" / "round-000"
    BUILD({}, BuildConfig(base="humaneval", round=0, shard_rows=100), d / "prompts")
    (tmp_path / "my model's dir").mkdir()
    cfg = parse_config(_base(d, base_model=str(tmp_path / "my model's dir"), n_gpus_per_node=1))
    cmd = build_command(cfg)
    c = compose(cmd[3:])  # what main_ppo's own @hydra.main reads from the same argv
    assert list(c.data.train_files) == sorted(str(p.resolve()) for p in (d / "prompts").glob("part-*.parquet"))
    assert c.actor_rollout_ref.model.path == str(tmp_path / "my model's dir")
    assert "All configuration checks passed" in dry_run_text(cfg)


def test_rejections_name_the_key(tmp_path, round_dir):
    def err(data):
        res = CliRunner().invoke(cli, ["train", "--config", _yaml(tmp_path, data), "--dry-run"])
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output
        return res.output

    typo = _base(round_dir)
    typo["overrides"]["actor_rollout_ref.rollout.nn"] = 8  # Hydra: not a key of verl's config
    assert "verl's config rejects the round's overrides" in err(typo) and "actor_rollout_ref.rollout.nn" in err(typo)
    owned = _base(round_dir)
    owned["overrides"]["data.train_files"] = "/x.parquet"
    assert "data.train_files is set by mentor; use prompts instead" in err(owned)
    # verl's own validate_config: 64 prompts x 4 samples do not split over 24 GPUs.
    assert "verl's validate_config rejects the round" in err(_base(round_dir, n_gpus_per_node=24))
    assert "must be divisible" in err(_base(round_dir, n_gpus_per_node=24))
    assert "n_samples_per_prompt: Input should be greater than or equal to 2" in err(_base(round_dir, n_samples_per_prompt=1))
    assert "empty-round/prompts: no such folder; run `mentor build" in err(_base(tmp_path / "empty-round"))
    (tmp_path / "empty-round" / "prompts").mkdir(parents=True)
    assert "no part-*.parquet shards" in err(_base(tmp_path / "empty-round"))
    # A workflow's verl trainer: config or command, not both.
    wf = {"name": "w", "base": "gsm8k", "trainer": {"kind": "verl", "config": {}, "command": "x"}}
    with pytest.raises(ConfigError, match="give either config .* or command"):
        validate_workflow(wf)
    wf["trainer"] = {"kind": "verl", "config": {"overrides": {"bad key": 1}}}
    with pytest.raises(ConfigError, match="trainer.config: overrides: 'bad key' is not a dotted verl key"):
        validate_workflow(wf)


def test_a_runtime_env_ray_would_not_merge_is_refused_before_launch(tmp_path, round_dir, monkeypatch):
    """Inside `ray job submit` the job's runtime env is already set; a variable verl's ray.init also sets is refused by
    Ray ("Failed to merge the Job's runtime env"): found before launch, with Ray's own merge."""
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"env_vars": {"NCCL_DEBUG": "INFO"}}}))
    res = CliRunner().invoke(cli, ["train", "--config", _yaml(tmp_path, _base(round_dir)), "--dry-run"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "ray.init in verl's run_ppo would refuse this round" in res.output and "NCCL_DEBUG" in res.output
    monkeypatch.setenv("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")  # Ray's switch: verl's value wins
    res = CliRunner().invoke(cli, ["train", "--config", _yaml(tmp_path, _base(round_dir)), "--dry-run"])
    assert res.exit_code == 0, res.output
    job = json.loads(shlex.split(next(ln for ln in res.stdout.splitlines() if ln.startswith("export RAY_JOB_CONFIG")))[1].split("=", 1)[1])
    assert job["runtime_env"]["env_vars"]["NCCL_DEBUG"] == "INFO" and "MENTOR_ROLLOUT_DIR" in job["runtime_env"]["env_vars"]


def test_no_final_checkpoint_is_refused_and_gpus_checked_before_launch(tmp_path, round_dir, monkeypatch, trainable_llama):
    with pytest.raises(ConfigError, match=r"overrides\.trainer\.save_freq -1: must be > 0"):  # refused on load (dry runs too)
        parse_config(_base(round_dir, overrides={"trainer.save_freq": -1, "data.train_batch_size": 64,
                                                 "actor_rollout_ref.actor.ppo_mini_batch_size": 32}))
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "4")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match=r"this round needs 8 GPUs .*MENTOR_FAKE_GPUS=4\) has 4"):
        run_round(parse_config(_base(round_dir, base_model=str(trainable_llama))))
    # A round whose prompts cannot be measured in the policy's tokens (its tokenizer is not here) is refused.
    with pytest.raises(ConfigError, match="could not be measured in the policy's tokens"):
        run_round(parse_config(_base(round_dir)))
    assert not (round_dir / "train" / "train.log").exists()  # refused before anything started
    assert "# GPUs: 8 GPUs" in dry_run_text(parse_config(_base(round_dir)))  # a dry run does not refuse


def test_gpu_demand_is_read_from_verls_composed_config():
    from mentor.training.gpus import GpuShortage, GpuSupply
    from mentor.training.verl.hydra import gpu_demand

    two_nodes = gpu_demand(compose(["trainer.n_gpus_per_node=8", "trainer.nnodes=2"]))
    assert two_nodes.describe() == "16 GPUs (16 shared by actor, rollout, reference: nnodes 2 x n_gpus_per_node 8)"
    two_nodes.check(GpuSupply(16, "the Ray cluster at h:6379", [8, 8]))
    with pytest.raises(GpuShortage, match=r"needs 2 nodes with 8 GPUs each .*\(0 with 8 or more\)"):
        two_nodes.check(GpuSupply(16, "the Ray cluster at h:6379", [4, 4, 4, 4]))
    # A reward model with a resource pool of its own (verl's reward.reward_model.enable_resource_pool).
    rm = gpu_demand(compose(["trainer.n_gpus_per_node=8", "trainer.nnodes=2", "reward.reward_model.enable=true",
                             "reward.reward_model.enable_resource_pool=true", "reward.reward_model.nnodes=1",
                             "reward.reward_model.n_gpus_per_node=4"]))
    assert rm.total == 20
    with pytest.raises(GpuShortage, match=r"needs 20 GPUs .*\+ 4 reward model.*has 16 on 2 nodes: set nnodes 1 \(then it needs 12\)"):
        rm.check(GpuSupply(16, "the Ray cluster at h:6379", [8, 8]))


def test_rerun_drops_the_rollouts_after_the_last_checkpoint(tmp_path):
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    logs.mkdir()
    (ckpt / "global_step_20" / "actor").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("20")
    cut = (ckpt / "latest_checkpointed_iteration.txt").stat().st_mtime
    recs = [{"problem_id": f"p{i}", "ts": cut + (i - 2)} for i in range(5)]  # 3 before or at the save, 2 after
    (logs / "verl-0123456789ab-host-1-aa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (logs / "other.jsonl").write_text("{}\n")
    from mentor.training.verl.checkpoints import last_checkpoint

    note = prepare_logs(logs, last_checkpoint(ckpt), "0123456789ab")
    assert note == "resuming from checkpoint step 20: dropped 2 rollout record(s) logged after it"
    kept = [json.loads(ln)["problem_id"] for ln in (logs / "verl-0123456789ab-host-1-aa.jsonl").read_text().splitlines()]
    assert kept == ["p0", "p1", "p2"]
    assert prepare_logs(logs, None, "0123456789ab") == "removed 1 rollout shard(s) of an earlier, unfinished attempt"
    assert sorted(p.name for p in logs.iterdir()) == ["other.jsonl"]


HINTER = '''
import json
def hinter(req):
    props = (req.json_schema or {}).get("properties", {})
    if "keywords" in props:
        return json.dumps({"keywords": ["quantity asked"], "error": "They answer a different quantity."})
    if "score" in props:
        return json.dumps({"score": 8, "feedback": "Specific and answer-free."})
    return json.dumps({"hint": "Decide which quantity the question asks for before computing anything."})
'''


def _standin_python(tmp_path: Path) -> str:
    """An interpreter path whose ``-m verl.trainer.main_ppo`` runs tests/verl_standin.py (everything else: this Python)."""
    exe = tmp_path / "python"
    exe.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "verl.trainer.main_ppo" ]; then shift 2; '
        f'exec {shlex.quote(sys.executable)} {shlex.quote(str(HERE / "verl_standin.py"))} "$@"; fi\n'
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def test_workflow_round_trains_with_verl_and_merges_the_model(tmp_path, trainable_llama, monkeypatch):
    from mentor.data import bundled
    from mentor.workflows.runner import RunOptions, Runner

    monkeypatch.setenv("MENTOR_FAKE_GPUS", "1")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wf_verl_fakes.py").write_text(HINTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    ids = pl.read_parquet(bundled("gsm8k_rollouts.parquet"))["problem_id"].unique().sort().head(6).to_list()
    problems = pl.read_parquet(bundled("gsm8k_problems.parquet")).filter(pl.col("problem_id").is_in(ids))
    problems.write_parquet(tmp_path / "problems.parquet")
    pl.read_parquet(bundled("gsm8k_rollouts.parquet")).filter(pl.col("problem_id").is_in(ids)).write_parquet(tmp_path / "r0.parquet")
    wf = validate_workflow({
        "name": "verl-rounds", "base": str(tmp_path / "problems.parquet"), "rounds": 2,
        "initial_rollouts": {"source": [str(tmp_path / "r0.parquet")], "format": "canonical"},
        "trainer": {"kind": "verl", "config": {"base_model": str(trainable_llama), "python": _standin_python(tmp_path),
                                               "overrides": {"data.train_batch_size": 4, "actor_rollout_ref.actor.ppo_mini_batch_size": 4}}},
        "hint": {"backend": {"backend": "fake", "options": {"script": "wf_verl_fakes:hinter"}}},
    })
    run_dir = tmp_path / "run"
    Runner(wf, run_dir, RunOptions(progress=False)).run()

    train = run_dir / "round-001" / "train"
    outcome = json.loads((train / "outcome.json").read_text())
    assert outcome["kind"] == "verl" and outcome["exit_code"] == 0 and outcome["steps"] == 1
    assert outcome["actor_model"] == str(trainable_llama)  # round 0 stood on existing logs: round 1 starts from the base model
    assert outcome["checkpoint"] == str(train / "ckpt" / "global_step_1" / "actor")
    assert outcome["merge_command"][1:5] == ["-m", "verl.model_merger", "merge", "--backend"]
    seen = json.loads((train / "ckpt" / "standin.json").read_text())
    shards = sorted((run_dir / "round-000" / "prompts").glob("part-*.parquet"))
    rows = pl.read_parquet(shards).height  # in batches of 4: the first rows repeated to a whole batch
    assert seen["train_files"] == [str(p) for p in shards] + ([str(train / "verl-pad.parquet")] if rows % 4 else [])
    assert outcome["repeated_rows"] == -rows % 4 and outcome["prompts_used"] == rows
    assert (seen["n"], seen["adv_estimator"], seen["env_vars"]["MENTOR_ROUND"]) == (4, "grpo", "1")
    # verl's own run_ppo started Ray (ray.init with verl's runtime env merged with the job's); the TaskRunner
    # actor got the rollout dir from that runtime env, as a worker on another node would.
    assert seen["runtime_env_vars"]["MENTOR_ROLLOUT_DIR"] == str(run_dir / "round-001" / "train" / "logs")
    assert seen["runtime_env_vars"]["MENTOR_ROUND"] == "1" and "TOKENIZERS_PARALLELISM" in seen["runtime_env_vars"]
    # verl's own config got the round's prompt limit: the longest prompt in the policy's tokens.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(trainable_llama)
    prompts = pl.read_parquet(run_dir / "round-000" / "prompts" / "*.parquet")["prompt"].to_list()
    from mentor.training.prompt_limits import prompt_room

    assert seen["max_prompt_length"] == prompt_room(max(
        len(tok(tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"])
        for p in prompts))
    assert seen["scores"] == [1.0, 0.0, 1.0, 0.0] * 2

    # The merged model is a Hugging Face folder: the original weights (in bfloat16, as the merger saves them)
    # and the tokenizer with its chat template; it is what round 2 would start from.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = Path(outcome["final_model"])
    assert final == train / "model" and not (train / ".model.tmp").exists()
    merged = AutoModelForCausalLM.from_pretrained(final).state_dict()
    original = AutoModelForCausalLM.from_pretrained(trainable_llama).state_dict()
    assert merged.keys() == original.keys()
    assert all(torch.equal(merged[k], original[k].to(torch.bfloat16)) for k in original)
    assert AutoTokenizer.from_pretrained(final).apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    cfg2 = parse_config({"kind": "verl", "round": 2, "round_dir": str(run_dir / "round-002"),
                         "prompts": str(run_dir / "round-001" / "prompts")})
    assert f"actor_rollout_ref.model.path={final}" in build_command(cfg2)  # round 2 starts from round 1's merged model

    # The reward file logged the 8 scored responses into the round's log dir; the runner ingested them.
    ro = pl.read_parquet(run_dir / "round-001" / "rollouts" / "*.parquet")
    assert ro.height == 8 and ro["correct"].sum() == 4 and set(ro["round"]) == {1}
    assert ro["source"].str.starts_with("verl:").all()
    assert os.path.isfile(run_dir / "round-001" / "prompts" / "part-00000.parquet")
