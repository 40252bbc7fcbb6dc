"""Prompt and response limits as the trainers see them, with the real tokenizers of the policies the method trains.

- verl renders a message prompt with ``data.apply_chat_template_kwargs`` (its agent loop's Continuous Token
  builder, `build_initial_tokens`) and keeps the last ``rollout.prompt_length`` tokens: the limit mentor sets
  must hold what verl renders, with a margin. Qwen3 with ``enable_thinking: false`` adds an empty think block.
- Response limits are explicit: the round's value or mentor's 4096, never verl's or TRL's 512, and the dry
  run prints which.
"""

from __future__ import annotations

import shlex

import polars as pl
import pytest
import yaml
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.stages.build import BUILD, BuildConfig
from mentor.training.prompt_limits import RESPONSE_DEFAULT, prompt_room


@pytest.fixture(scope="module")
def round_dir(tmp_path_factory):
    """round-000: `mentor build`'s MATH-500 prompts (message prompts, unhinted)."""
    d = tmp_path_factory.mktemp("run") / "round-000"
    BUILD({}, BuildConfig(base="math500", round=0), d / "prompts")
    return d


@pytest.fixture(scope="module")
def no_thinking_round_dir(tmp_path_factory):
    """The same prompts built for a trainer that passes ``enable_thinking: false`` (a trainer must pass the
    variables its prompts were built with: `prompt_format.check_template_kwargs`)."""
    d = tmp_path_factory.mktemp("run") / "round-000"
    BUILD({}, BuildConfig(base="math500", round=0, chat_template_kwargs={"enable_thinking": False}), d / "prompts")
    return d


def _verl(round_dir, tokenizer, **overrides):
    from mentor.training.verl.launcher import parse_config

    return parse_config({"kind": "verl", "round": 0, "round_dir": str(round_dir), "base_model": str(tokenizer),
                         "n_gpus_per_node": 1, "overrides": {"data.train_batch_size": 100,
                                                             "actor_rollout_ref.actor.ppo_mini_batch_size": 50} | overrides})


def _composed(out: str):
    from mentor.training.verl.hydra import compose

    return compose(shlex.split(next(ln for ln in out.splitlines() if "verl.trainer.main_ppo" in ln))[3:])


@pytest.mark.verl
@pytest.mark.parametrize("family", ["qwen3", "llama3_1", "deepseek_v3"])
def test_verls_prompt_limit_holds_what_verl_renders_with_the_rounds_template_kwargs(no_thinking_round_dir, shared_data,
                                                                                     family):
    pytest.importorskip("verl")
    from transformers import AutoTokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from mentor.training.verl.launcher import dry_run_text

    tok_dir = shared_data / "tokenizers" / family
    round_dir = no_thinking_round_dir
    out = dry_run_text(_verl(round_dir, tok_dir, **{"+data.apply_chat_template_kwargs.enable_thinking": False}))
    c = _composed(out)
    # verl's own rendering of every prompt (its agent loop's builder, with the round's kwargs as verl reads them).
    builder = create_continuous_token_builder(AutoTokenizer.from_pretrained(tok_dir),
                                              chat_template_kwargs=dict(c.data.apply_chat_template_kwargs))
    prompts = pl.read_parquet(round_dir / "prompts" / "*.parquet")["prompt"].to_list()
    rendered = max(len(builder.build_initial_tokens([dict(m) for m in p])) for p in prompts)
    assert c.data.max_prompt_length == c.actor_rollout_ref.rollout.prompt_length == prompt_room(rendered)
    assert prompt_room(rendered) - rendered >= 16  # the stated margin, not the longest prompt exactly
    assert f"# longest prompt: {rendered} tokens" in out and '"enable_thinking": false' in out
    if family == "qwen3":  # the kwargs add the closed think block: a measurement without them is too short
        plain = AutoTokenizer.from_pretrained(tok_dir)
        without = max(len(plain.apply_chat_template([dict(m) for m in p], tokenize=True, add_generation_prompt=True))
                      for p in prompts)
        assert rendered > without


@pytest.mark.verl
def test_verls_response_limit_is_explicit(round_dir, shared_data):
    pytest.importorskip("verl")
    from mentor.training.verl.launcher import dry_run_text

    tok = shared_data / "tokenizers" / "qwen3"
    out = dry_run_text(_verl(round_dir, tok))
    c = _composed(out)
    assert c.data.max_response_length == c.actor_rollout_ref.rollout.response_length == RESPONSE_DEFAULT != 512
    assert f"# response limit: data.max_response_length={RESPONSE_DEFAULT} (mentor's default" in out
    out = dry_run_text(_verl(round_dir, tok, **{"data.max_response_length": 8192}))
    assert _composed(out).actor_rollout_ref.rollout.response_length == 8192
    assert "# response limit: data.max_response_length=8192 (the round config)" in out


def test_trls_completion_limit_is_explicit(tmp_path, no_thinking_round_dir, shared_data):
    pytest.importorskip("trl")
    from trl import GRPOConfig

    assert GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False).max_completion_length == 512  # TRL's own
    cfg = {"kind": "trl", "round_dir": str(no_thinking_round_dir), "base_model": str(shared_data / "tokenizers" / "qwen3"), "limit": 8,
           "chat_template_kwargs": {"enable_thinking": False}}
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["train", "--config", str(path), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f'"max_completion_length": {RESPONSE_DEFAULT}' in res.output  # as TRL resolved it
    assert f"# response limit: max_completion_length={RESPONSE_DEFAULT} (mentor's default" in res.output
    assert '"enable_thinking": false' in next(ln for ln in res.output.splitlines() if ln.startswith("# longest prompt"))


def test_openrlhfs_response_limit_is_explicit(tmp_path, round_dir, shared_data):
    """OpenRLHF 0.11.2's own default has no response limit (data.max_len 2048 minus the prompt); mentor sets one,
    and data.max_len holds the longest prompt with its margin and a whole response: as OpenRLHF's parser reads them."""
    pytest.importorskip("openrlhf")
    from mentor.training.openrlhf.check import check_with_openrlhf
    from mentor.training.openrlhf.launcher import TrainConfig, round_command

    cfg = TrainConfig(round=0, round_dir=str(round_dir), base_model=str(shared_data / "tokenizers" / "llama3_1"))
    cmd, found = round_command(cfg, dry_run=True)
    i, j = cmd.index("--rollout.max_new_tokens"), cmd.index("--data.max_len")
    bare = [a for k, a in enumerate(cmd) if k not in (i, i + 1, j, j + 1)]
    args = check_with_openrlhf(bare)[0]  # OpenRLHF's own: no limit (dynamic, max_len - prompt) in 2048
    assert args.rollout.max_new_tokens is None and args.data.max_len == 2048
    args = check_with_openrlhf(cmd)[0]
    assert args.rollout.max_new_tokens == RESPONSE_DEFAULT
    assert args.data.max_len == prompt_room(found.tokens) + RESPONSE_DEFAULT


def test_every_prompt_of_a_trl_round_is_in_a_generation_batch(tmp_path, round_dir, shared_data):
    """TRL 1.16's RepeatSampler drops an incomplete chunk of generation_batch_size // num_generations prompts."""
    pytest.importorskip("trl")
    from trl.trainer.utils import RepeatSampler

    from mentor.pipeline.errors import ConfigError
    from mentor.training.trl.launcher import parse_config, prompt_batches, resolve_grpo, training_rows

    base = {"kind": "trl", "round_dir": str(round_dir), "base_model": str(shared_data / "tokenizers" / "qwen3"),
            "use_cpu": True, "per_device_train_batch_size": 8, "num_generations": 4}
    cfg = parse_config(base | {"limit": 7})
    args = resolve_grpo(cfg)
    per, pad, note = prompt_batches(cfg, args, 7)
    assert (per, pad) == (2, 1) and "the round's first 1 row(s) are repeated" in note
    rows = training_rows(cfg, pad)
    sampler = RepeatSampler(data_source=rows, mini_repeat_count=args.num_generations,
                            batch_size=args.generation_batch_size // args.num_generations,
                            repeat_count=args.num_iterations * args.steps_per_generation, shuffle=True, seed=args.seed)
    seen = {rows[i]["label"] for i in sampler}
    assert seen == {r["label"] for r in training_rows(cfg)} and len(seen) == 7
    with pytest.raises(ConfigError, match=r"the round has 1 prompt row\(s\), fewer than one generation batch of 2 prompts"):
        prompt_batches(parse_config(base | {"limit": 1}), args, 1)
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump(base | {"limit": 7}))
    res = CliRunner().invoke(cli, ["train", "--config", str(path), "--dry-run"])
    assert res.exit_code == 0 and "# batches: 7 prompts in generation batches of 2" in res.output, res.output


@pytest.mark.verl
def test_verl_kwargs_given_key_by_key_must_match_the_build(round_dir, no_thinking_round_dir, shared_data):
    """``+data.apply_chat_template_kwargs.enable_thinking=false`` is what verl renders with: prompts built without it
    are refused before launch, and prompts built with it are taken."""
    pytest.importorskip("verl")
    from mentor.pipeline.errors import ConfigError
    from mentor.training.verl.launcher import dry_run_text

    tok = shared_data / "tokenizers" / "qwen3"
    key = {"+data.apply_chat_template_kwargs.enable_thinking": False}
    with pytest.raises(ConfigError, match=r"built with chat_template_kwargs \{\}, but the trainer passes \{'enable_thinking': False\}"):
        dry_run_text(_verl(round_dir, tok, **key))
    assert "main_ppo" in dry_run_text(_verl(no_thinking_round_dir, tok, **key))
