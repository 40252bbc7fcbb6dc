"""Placement ``assistant``: the hint opens the policy's answer, rendered with the policy's chat template.

`mentor build` writes text prompts (unhinted rows exactly what a trainer renders itself),
`mentor rescue` and vouching send the same text, the longest prompt is counted in the
policy's tokens, and verl (which cannot take them) is refused. The trainers' own loaders
read the text in tests/test_openrlhf_contract.py and tests/test_trl_contract.py.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.prompts import ANSWER_TEMPLATES, DEFAULT_ANSWER, INSTRUCTIONS, load_tokenizer, render_prompt
from mentor.stages.build import BUILD, BuildConfig
from mentor.pipeline.prompts import prompt_token_lengths
from mentor.pipeline.stage import Context

from test_build import make_hints


@pytest.fixture(scope="module")
def tok_name() -> str:
    from mentor.pipeline.models import ensure_embedded_model

    try:
        return str(ensure_embedded_model())
    except Exception as exc:  # the embedded model's package is part of the cpu extra
        pytest.skip(f"embedded model unavailable: {exc}")


@pytest.fixture(scope="module")
def hints(tmp_path_factory, gsm8k_collapsed):
    ids = pl.read_parquet(gsm8k_collapsed).get_column("problem_id").sort().head(12).to_list()
    rows = [{"problem_id": pid, "hint": f"Find how many are left after step {i % 3 + 1}, then use only those.", "hint_id": f"h-{i:03d}"}
            for i, pid in enumerate(ids)]
    return make_hints(rows, tmp_path_factory.mktemp("hints") / "hints.parquet")


@pytest.fixture(scope="module")
def text_build(tmp_path_factory, hints, tok_name):
    out = tmp_path_factory.mktemp("text") / "prompts"
    stats = BUILD({}, BuildConfig(base="gsm8k", hints=[str(hints)], tokenizer=tok_name, mode="both"), out)
    return out, stats


def _problems() -> dict[str, str]:
    from mentor.data import bundled

    return dict(pl.read_parquet(bundled("gsm8k_problems.parquet")).select("problem_id", "problem").iter_rows())


def test_with_a_tokenizer_the_hint_opens_the_answer_and_every_prompt_is_the_policys_text(text_build, hints, tok_name):
    out, stats = text_build
    tok = load_tokenizer(tok_name)
    df = pl.read_parquet(out / "part-*.parquet")
    assert df.schema["prompt"] == pl.String and stats.placement == "assistant" and stats.prompt_format == "text"
    problems, by_hint = _problems(), dict(pl.read_parquet(hints).select("problem_id", "hint").iter_rows())
    user = {pid: f"{p}\n\n{INSTRUCTIONS['math']}" for pid, p in problems.items()}
    for row in df.iter_rows(named=True):
        chat = [{"role": "user", "content": user[row["problem_id"]]}]
        if row["hint_id"] is None:  # exactly what OpenRLHF, verl and TRL render from messages themselves
            assert row["prompt"] == tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            continue
        opened = ANSWER_TEMPLATES[DEFAULT_ANSWER].format(hint=by_hint[row["problem_id"]])
        want = tok.apply_chat_template([*chat, {"role": "assistant", "content": opened}], tokenize=False,
                                       continue_final_message=True)
        assert row["prompt"] == want and want.endswith(f"<|im_start|>assistant\n{opened}") and "<|im_end|>" not in want[-len(opened):]
    assert df.filter(pl.col("hint_id").is_not_null()).height == 12 and df.height == 1319 + 12


def test_max_prompt_tokens_is_the_longest_prompt_in_the_policys_tokens(text_build, tok_name, tmp_path):
    out, stats = text_build
    tok = load_tokenizer(tok_name)
    texts = pl.read_parquet(out / "part-*.parquet")["prompt"].to_list()
    longest = max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    manifest, saved = json.loads((out / "manifest.json").read_text()), json.loads((out / "stats.json").read_text())
    for d in (manifest, saved):
        assert d["max_prompt_tokens"] == stats.max_prompt_tokens == longest and d["prompt_tokenizer"] == tok_name
    assert manifest["prompt_format"] == "text" and manifest["placement"] == "assistant"
    # message prompts: counted as the trainers render them (chat template with the generation prompt)
    msg = BUILD({}, BuildConfig(base="gsm8k", tokenizer=tok_name, placement="after", shard_rows=400), tmp_path / "m")
    rows = pl.read_parquet(tmp_path / "m" / "part-*.parquet")["prompt"].to_list()
    assert msg.max_prompt_tokens == max(prompt_token_lengths(rows, tok)) and msg.prompt_format == "messages"
    assert msg.max_prompt_tokens == max(len(tok.apply_chat_template(r, add_generation_prompt=True, return_dict=True)["input_ids"])
                                        for r in rows)
    # without a tokenizer: nothing counted, as before
    plain = BUILD({}, BuildConfig(base="gsm8k"), tmp_path / "p")
    assert plain.max_prompt_tokens is None and plain.prompt_tokenizer is None and plain.placement == "after"
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["max_prompt_tokens"] is None


def test_prompt_token_lengths_takes_messages_and_text(tok_name):
    tok = load_tokenizer(tok_name)
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    text = render_prompt(tok, [*chat, {"role": "assistant", "content": "Add them."}])
    got = prompt_token_lengths([chat, text], tok_name)
    assert got == [len(tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]),
                   len(tok(text, add_special_tokens=False)["input_ids"])]
    assert prompt_token_lengths([], tok) == []


def test_answer_templates_and_errors(tmp_path, hints, tok_name):
    out = tmp_path / "l"
    BUILD({}, BuildConfig(base="gsm8k", hints=[str(hints)], tokenizer=tok_name, answer_template="labelled"), out)
    hinted = pl.read_parquet(out / "part-*.parquet").filter(pl.col("hint_id").is_not_null())["prompt"].to_list()
    assert all("<|im_start|>assistant\nHint: Find how many" in p and p.endswith("\n\n") for p in hinted)
    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--out", str(tmp_path / "x"), "--placement", "assistant"])
    assert r.exit_code == 2 and "--tokenizer" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--out", str(tmp_path / "y"), "--tokenizer", tok_name,
                                 "--answer-template", "no placeholder"])
    assert r.exit_code == 2 and "{hint}" in r.output
    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--out", str(tmp_path / "z"), "--tokenizer", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "cannot load its tokenizer" in r.output
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()


def test_rescue_sends_the_prompts_build_writes(text_build, hints, gsm8k_collapsed, tok_name):
    """One rendering: `mentor rescue`'s hinted and unhinted prompts are build's, character for character."""
    from mentor.stages.rescue import rescue_items
    from mentor.stages.rollout import RolloutConfig

    out, _ = text_build
    built = {(r["problem_id"], r["hint_id"]): r["prompt"] for r in pl.read_parquet(out / "part-*.parquet").iter_rows(named=True)}
    cfg = RolloutConfig(tokenizer=tok_name).for_policy(None)
    assert cfg.placement == "assistant"
    items, kept, _ = rescue_items(pl.read_parquet(gsm8k_collapsed), {"h": pl.read_parquet(hints)}, cfg)
    assert len(kept) == 12 and len(items) == 24
    for it in items:
        assert it.prompt == built[(it.problem_id, it.hint_id)], (it.arm, it.problem_id)
    # the vllm policy's own tokenizer is the default; a policy without one keeps a message placement
    from mentor.pipeline.llm import BackendSpec

    vllm = RolloutConfig().for_policy(BackendSpec("vllm", "qwen2.5-coder-0.5b"))
    assert (vllm.placement, vllm.tokenizer) == ("assistant", "qwen2.5-coder-0.5b")
    assert RolloutConfig(placement="after").for_policy(BackendSpec("vllm", "x")).tokenizer is None  # nothing to render
    assert RolloutConfig().for_policy(BackendSpec("fake")).placement == "after"
    with pytest.raises(ConfigError, match="placement assistant renders the prompt with the policy's chat template"):
        RolloutConfig(placement="assistant").for_policy(BackendSpec("fake"))


def test_code_tasks_keep_the_hint_in_the_user_turn_by_default(tmp_path, tok_name):
    """With a tokenizer the default opens the answer only for math: on code the 0.5B explained text there
    instead of writing the program (the whole solution: 0 of 42 HumanEval tasks right), so a base set with
    code tasks defaults to `after`; asking for `assistant` still gets it."""
    from mentor.data import bundled
    from mentor.pipeline.llm import BackendSpec
    from mentor.stages.rescue import rescue_items
    from mentor.stages.rollout import RolloutConfig

    ids = pl.read_parquet(bundled("humaneval_problems.parquet")).get_column("problem_id").head(6).to_list()
    hints = make_hints([{"problem_id": pid, "hint": "Trace the loop on the first docstring example.", "hint_id": f"c-{i}"}
                        for i, pid in enumerate(ids)], tmp_path / "hints.parquet")
    stats = BUILD({}, BuildConfig(base="humaneval", hints=[str(hints)], tokenizer=tok_name), tmp_path / "code")
    assert (stats.placement, stats.prompt_format) == ("after", "messages")
    manifest = json.loads((tmp_path / "code" / "manifest.json").read_text())
    assert manifest["placement"] == "after" and manifest["prompt_format"] == "messages"
    rows = pl.read_parquet(tmp_path / "code" / "part-*.parquet").filter(pl.col("hint_id").is_not_null())
    assert rows.height == 6
    for msgs in rows.get_column("prompt").to_list():
        assert [m["role"] for m in msgs] == ["user"] and "\n\nHint: Trace the loop" in msgs[0]["content"]
    asked = BUILD({}, BuildConfig(base="humaneval", hints=[str(hints)], tokenizer=tok_name, placement="assistant"),
                  tmp_path / "asked")
    assert (asked.placement, asked.prompt_format) == ("assistant", "text")

    spec = BackendSpec("vllm", "qwen2.5-coder-0.5b")
    assert RolloutConfig().for_policy(spec, domains=["code"]).placement == "after"
    assert RolloutConfig().for_policy(spec, domains=["math", "code"]).placement == "after"
    assert RolloutConfig().for_policy(spec, domains=["math"]).placement == "assistant"
    collapsed = pl.read_parquet(bundled("humaneval_problems.parquet")).head(6).with_columns(round=pl.lit(0))
    cfg = RolloutConfig().for_policy(spec, domains=collapsed.get_column("domain").unique().to_list())
    items, kept, _ = rescue_items(collapsed, {"h": pl.read_parquet(hints)}, cfg)
    assert len(kept) == 6 and all(it.prompt is None for it in items)  # chat messages: nothing rendered to text


def test_rescue_logs_the_prompt_as_sent(hints, gsm8k_collapsed, tok_name, tmp_path):
    from mentor.pipeline.llm import BackendSpec
    from mentor.stages.rescue import RESCUE
    from mentor.stages.rollout import RolloutConfig

    spec = BackendSpec("fake", options={"script": "mentor.pipeline.backends.fake:echo_script"})
    stats = RESCUE({"collapsed": [str(gsm8k_collapsed)], "arms": {"h": [str(hints)]}},
                   RolloutConfig(k=2, tokenizer=tok_name), tmp_path / "r", Context(backend=spec))
    assert stats.as_dict()["arms"]["h"]["placement"] == "assistant"
    rolled = pl.read_parquet(tmp_path / "r" / "rollouts" / "*.parquet")
    by_hint = dict(pl.read_parquet(hints).select("problem_id", "hint").iter_rows())
    hinted = rolled.filter(pl.col("hint_id").is_not_null())
    assert hinted.height == 24
    for pid, p in hinted.select("problem_id", "prompt").iter_rows():
        opened = ANSWER_TEMPLATES[DEFAULT_ANSWER].format(hint=by_hint[pid])
        assert p.startswith("<|im_start|>") and p.endswith(f"<|im_start|>assistant\n{opened}")
    # the fake policy saw the text, not the messages: the request carried it
    assert all(p.endswith("<|im_start|>assistant\n") for p in rolled.filter(pl.col("hint_id").is_null())["prompt"])


def test_vouching_rerolls_send_builds_text(tok_name, gsm8k_collapsed):
    import pyarrow.parquet as pq

    from mentor.pipeline.backends.fake import FakeBackend
    from mentor.stages.hint.config import HintConfig
    from mentor.stages.hint.vouch import vouch_shard

    rows = pq.read_table(gsm8k_collapsed).sort_by("problem_id").slice(0, 2).to_pylist()
    pol = FakeBackend(script=lambda req: "\\boxed{123456789}")
    cfg = HintConfig(judge_check={"enabled": False}, vouch={"samples": 2, "candidates": 1, "tokenizer": tok_name})
    table = vouch_shard(rows, cfg, FakeBackend(script="mentor.stages.hint.agents:fake_script"), policy=pol)
    tok = load_tokenizer(tok_name)
    for i, (r, h) in enumerate(zip(rows, table.column("hint").to_pylist())):
        req = pol.log[0][i * 2]
        opened = ANSWER_TEMPLATES[DEFAULT_ANSWER].format(hint=h)
        assert req.prompt == render_prompt(tok, [{"role": "user", "content": f"{r['problem']}\n\n{INSTRUCTIONS['math']}"},
                                                 {"role": "assistant", "content": opened}])


def test_verl_is_refused_text_prompts(text_build, tmp_path, tok_name):
    """verl 0.9.1's agent loop renders messages with add_generation_prompt=True (its Continuous Token builder): an
    opened answer is closed and a new turn starts, and a text prompt is not messages. So such shards are refused."""
    pytest.importorskip("verl")
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from mentor.training.openrlhf.launcher import openrlhf_data_flags
    from mentor.training.prompt_format import check_readable

    out, _ = text_build
    tok = load_tokenizer(tok_name)
    builder = create_continuous_token_builder(tok, hf_model_type="llama")
    msgs = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "First add 2 and 3"}]
    rendered = tok.decode(builder.build_initial_tokens(msgs))
    assert rendered.endswith("First add 2 and 3<|im_end|>\n<|im_start|>assistant\n")  # closed, not continued
    with pytest.raises(ConfigError, match=r"placement assistant \(text prompts\); verl 0\.9\.1 renders every prompt from chat "
                                          r"messages.*--placement after"):
        check_readable("verl", [str(out)])
    check_readable("trl", [str(out)])
    msg_out = tmp_path / "m"
    BUILD({}, BuildConfig(base="gsm8k", tokenizer=tok_name, placement="after"), msg_out)
    check_readable("verl", [str(msg_out)])
    assert "--data.apply_chat_template" not in openrlhf_data_flags([str(out)])
    assert openrlhf_data_flags([str(msg_out)])[-1] == "--data.apply_chat_template"


def test_a_workflow_refuses_text_prompts_for_verl_only(tok_name):
    from mentor.workflows.config import validate_workflow

    base = {"name": "w", "base": "gsm8k", "build": {"placement": "assistant", "tokenizer": tok_name}}
    with pytest.raises(ConfigError, match="build.placement assistant: .*verl 0.9.1 renders.*use placement after") as err:
        validate_workflow(base | {"trainer": {"kind": "verl", "command": "true"}})
    assert "\n" not in str(err.value)
    validate_workflow(base | {"trainer": {"kind": "trl", "config": {"base_model": tok_name}}})
    validate_workflow(base | {"trainer": {"kind": "openrlhf", "config": {"base_model": tok_name}}})


def test_the_launchers_hand_text_prompts_on_as_text(text_build, tmp_path, tok_name):
    """`mentor train`: OpenRLHF gets the text prompts without --data.apply_chat_template (its PromptDataset then takes
    them verbatim, tests/test_openrlhf_contract.py), sized in the policy's tokens; verl is refused them."""
    from mentor.training.openrlhf.launcher import TrainConfig, round_command
    from mentor.training.verl.launcher import parse_config as parse_verl
    from mentor.training.verl.launcher import train_files

    out, stats = text_build
    cmd, found = round_command(TrainConfig(round_dir=str(tmp_path / "round-001"), base_model=tok_name, prompts=str(out)),
                               dry_run=True)
    assert "--data.apply_chat_template" not in cmd and cmd[cmd.index("--data.input_key") + 1] == "prompt"
    assert found.tokens == stats.max_prompt_tokens and found.how == "stats.json of the build"
    with pytest.raises(ConfigError, match="placement assistant"):
        train_files(parse_verl({"kind": "verl", "round_dir": str(tmp_path / "round-001"), "prompts": str(out)}))


def test_ingest_recovers_the_problem_from_a_prompt_whose_answer_the_hint_opens(text_build):
    """A logged text prompt gives back its problem without the opened answer (ingest's last resort when no problem
    set names the id), and a hint id without an opened answer is not guessed at."""
    from mentor.stages.ingest_problems import recover_problem

    out, _ = text_build
    problems = _problems()
    df = pl.read_parquet(out / "part-*.parquet")
    for row in df.filter(pl.col("hint_id").is_not_null()).iter_rows(named=True):
        want = problems[row["problem_id"]]
        assert recover_problem(row["prompt"], row["problem_id"], row["hint_id"], knows_hint=True) == want
        assert recover_problem(row["prompt"], "gsm8k/123", row["hint_id"], knows_hint=True) == want  # an id that is not a hash
        assert recover_problem(row["prompt"]) == want
    plain = df.filter(pl.col("hint_id").is_null()).row(0, named=True)
    assert recover_problem(plain["prompt"], "gsm8k/1", None, knows_hint=True) == problems[plain["problem_id"]]
    assert recover_problem(plain["prompt"], "gsm8k/1", "h-x", knows_hint=True) is None
