"""The prompts the policy sees, for the families the method trains (issue 57 rows 1, 2, 9; issue 59's template cases).

Real tokenizers through transformers (../shared/data/tokenizers: Qwen3 with its ``enable_thinking`` template,
Llama-3.1 and DeepSeek-V3, which write a BOS; the embedded SmolLM2 and the cached Qwen2.5-Coder), real GSM8K
problems through `mentor build`, and each trainer's own tokenizing code: TRL 1.16's
``GRPOTrainer._tokenize_prompts``, OpenRLHF 0.11.2's ``SingleTurnAgentExecutor``, verl 0.9.1's Continuous Token
builder (what its agent loop renders chat prompts with).

- A hinted prompt is its problem's unhinted prompt (the template's generation prompt, the round's template
  variables) plus the opener the policy would write itself, plus the hint: Qwen3 thinking (``<think>\\n`` then
  the hint), Qwen3 non-thinking (the closed empty block, then the hint), the DeepSeek-R1 family (the template's
  ``<think>\\n`` kept), Llama-3.1 / DeepSeek-V3 (the hint as the answer template writes it).
- SmolLM2 and Qwen2.5 (no thinking block, no BOS) render byte for byte as before.
- One BOS on every row through TRL, OpenRLHF and verl.
- Placement assistant through a server goes to the completions API as the same text; ``max_tokens`` stays within
  the server's ``max_model_len``.
- A template without an assistant turn, or one that raises, is a clear error; ``--answer-template`` with another
  placement is a usage error.
"""

from __future__ import annotations

import asyncio
import json
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.data import bundled
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.policy_template import policy_mode, render_prompt
from mentor.stages.build import BUILD, BuildConfig

from test_build import make_hints

transformers = pytest.importorskip("transformers")

BASE: list[str] = []  # the `base` fixture's file, once made
HINT = "Find how many eggs are left after breakfast and baking first."
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# DeepSeek-R1's tokenizer_config.json differs from DeepSeek-V3's (the template family) in its generation prompt:
# '<｜Assistant｜><think>\n' where V3 writes '<｜Assistant｜>' (the R1 release of 2025-02; R1-Distill-* share it).
V3_GENERATION = "{{'<｜Assistant｜>'}}{% endif %}"
R1_GENERATION = "{{'<｜Assistant｜><think>\\n'}}{% endif %}"


@pytest.fixture(scope="module")
def tokenizers(shared_data) -> dict[str, Path]:
    folder = shared_data / "tokenizers"
    found = {n: folder / n for n in ("qwen3", "llama3_1", "deepseek_v3") if (folder / n / "tokenizer.json").is_file()}
    if len(found) < 3:
        pytest.skip(f"the three policy tokenizers are not all in {folder}")
    return found


@lru_cache(maxsize=None)
def load(path: Path | str):
    """A tokenizer, loaded once (tests that change a template load their own)."""
    return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def r1_tokenizer(tokenizers, tmp_path_factory) -> Path:
    """DeepSeek-V3's real tokenizer with the R1 family's generation prompt, saved as a tokenizer folder."""
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizers["deepseek_v3"]))
    assert tok.chat_template.count(V3_GENERATION) == 1
    tok.chat_template = tok.chat_template.replace(V3_GENERATION, R1_GENERATION)
    out = tmp_path_factory.mktemp("r1") / "tokenizer"
    tok.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def problem() -> dict:
    return pl.read_parquet(bundled("gsm8k_problems.parquet")).row(0, named=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    """Six real GSM8K problems (the first one hinted): a problems set for quick builds."""
    path = tmp_path_factory.mktemp("base") / "gsm8k6.parquet"
    pl.read_parquet(bundled("gsm8k_problems.parquet")).head(6).write_parquet(path)
    return str(path)


@pytest.fixture(scope="module")
def hints(tmp_path_factory, problem) -> Path:
    return make_hints([{"problem_id": problem["problem_id"], "hint": HINT, "hint_id": "h-egg"}],
                      tmp_path_factory.mktemp("hints") / "hints.parquet")


@pytest.fixture(scope="module", autouse=True)
def _base_set(base) -> None:
    BASE[:] = [base]


def build_pair(tmp_path: Path, hints: Path, tokenizer: Path | str, **settings) -> tuple[str, str, dict]:
    """`mentor build --mode both --placement assistant` with `tokenizer`: the hinted problem's (unhinted, hinted)
    text prompts and the build's stats."""
    out = tmp_path / "prompts"
    stats = BUILD({}, BuildConfig(base=BASE[0], hints=[str(hints)], tokenizer=str(tokenizer), mode="both",
                                  placement="assistant", **settings), out)
    rows = pl.read_parquet(out / "part-*.parquet")
    pid = rows.filter(pl.col("hint_id") == "h-egg")["problem_id"][0]
    pair = rows.filter(pl.col("problem_id") == pid)
    plain = pair.filter(pl.col("hint_id").is_null())["prompt"][0]
    hinted = pair.filter(pl.col("hint_id") == "h-egg")["prompt"][0]
    return plain, hinted, stats.as_dict()


# --------------------------------------------------------------------------- row 1: the same mode


def test_qwen3_thinking_mode_the_hint_opens_the_reasoning(tokenizers, hints, problem, tmp_path):
    """Qwen3's default (thinking) mode: the unhinted prompt ends at the generation prompt and the policy writes
    ``<think>\\n`` first, so the hinted row is that prompt + ``<think>\\n`` + the hint; never the closed empty block
    of the non-thinking mode (what ``continue_final_message`` rendered: 'the hint arm measures a mode switch')."""
    plain, hinted, stats = build_pair(tmp_path, hints, tokenizers["qwen3"])
    tok = load(tokenizers["qwen3"])
    user = [{"role": "user", "content": f"{problem['problem']}\n\n{INSTRUCTION}"}]
    assert plain == tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert plain.endswith("<|im_start|>assistant\n")
    assert hinted == plain + "<think>\n" + HINT + "\n\n"
    assert "</think>" not in hinted
    assert stats["policy_mode"] == "thinking" and stats["chat_template_kwargs"] == {}


def test_qwen3_non_thinking_mode_comes_from_the_round_kwargs(tokenizers, hints, problem, tmp_path):
    """``chat_template_kwargs: {enable_thinking: false}`` (what the trainer passes): every row, hinted or not, is
    in non-thinking mode, the hint after the template's closed block; max_prompt_tokens counts with the kwargs."""
    plain, hinted, stats = build_pair(tmp_path, hints, tokenizers["qwen3"], chat_template_kwargs={"enable_thinking": False})
    tok = load(tokenizers["qwen3"])
    user = [{"role": "user", "content": f"{problem['problem']}\n\n{INSTRUCTION}"}]
    assert plain == tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert plain.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert hinted == plain + HINT + "\n\n"
    assert stats["policy_mode"] == "non-thinking" and stats["chat_template_kwargs"] == {"enable_thinking": False}
    manifest = json.loads((tmp_path / "prompts" / "manifest.json").read_text())
    assert manifest["chat_template_kwargs"] == {"enable_thinking": False} and manifest["policy_mode"] == "non-thinking"
    longest = max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in pl.read_parquet(tmp_path / "prompts" / "part-*.parquet")["prompt"])
    assert stats["max_prompt_tokens"] == longest


def test_r1_family_keeps_the_templates_think_opener(r1_tokenizer, hints, tmp_path):
    """The DeepSeek-R1 family writes ``<think>\\n`` in its generation prompt: the hinted row keeps it and the hint
    opens the reasoning (``continue_final_message`` dropped it)."""
    plain, hinted, stats = build_pair(tmp_path, hints, r1_tokenizer)
    assert plain.endswith("<｜Assistant｜><think>\n") and plain.startswith("<｜begin▁of▁sentence｜>")
    assert hinted == plain + HINT + "\n\n"
    assert stats["policy_mode"] == "thinking"


@pytest.mark.parametrize("family", ["llama3_1", "deepseek_v3"])
def test_templates_without_a_thinking_block_add_the_hint_as_written(family, tokenizers, hints, tmp_path):
    """Llama-3.1 and DeepSeek-V3: the hinted row is the unhinted one plus the hint exactly as the answer template
    writes it (Llama's template trimmed its blank line when it rendered the hint as a message)."""
    plain, hinted, stats = build_pair(tmp_path, hints, tokenizers[family])
    tok = load(tokenizers[family])
    assert hinted == plain + HINT + "\n\n"
    assert plain.count(tok.bos_token) == 1 and plain.startswith(tok.bos_token)
    assert stats["policy_mode"] == "no thinking block"


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_templates_without_a_thinking_block_render_as_before(name, hints, problem, tmp_path):
    """SmolLM2 and Qwen2.5 (no thinking block, no BOS): byte for byte what build wrote before (the template's
    rendering of the open assistant message), pinned literally."""
    from mentor.pipeline.models import resolve_model

    try:
        folder = resolve_model(name)
        tok = load(folder)
    except Exception as exc:  # the embedded model / the CPU model cache
        pytest.skip(f"{name} not available here: {exc}")
    plain, hinted, _ = build_pair(tmp_path, hints, folder)
    user = f"{problem['problem']}\n\n{INSTRUCTION}"
    old = tok.apply_chat_template([{"role": "user", "content": user}, {"role": "assistant", "content": HINT + "\n\n"}],
                                  tokenize=False, continue_final_message=True)
    assert hinted == old
    system = ("You are a helpful AI assistant named SmolLM, trained by Hugging Face" if name.startswith("smol") else
              "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
    assert hinted == (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                      f"<|im_start|>assistant\n{HINT}\n\n")
    assert plain == hinted[: -len(HINT + "\n\n")]


# --------------------------------------------------------------------------- row 2: one BOS


def _tokenize_like_trl(tok, prompts: list, kwargs: dict | None = None) -> list[list[int]]:
    """TRL 1.16's own ``GRPOTrainer._tokenize_prompts`` (the method, called on a stand-in for the trainer)."""
    trl = pytest.importorskip("trl")
    stand_in = SimpleNamespace(processing_class=tok, _is_vlm=False, environment_factories=None, tools=None,
                               chat_template=None, chat_template_kwargs=kwargs or {})
    ids, _, _ = trl.GRPOTrainer._tokenize_prompts(stand_in, prompts)
    return [list(x) for x in ids]


@pytest.mark.parametrize("family", ["llama3_1", "deepseek_v3", "qwen3", "r1"])
def test_one_bos_through_trl_for_text_and_chat_prompts(family, tokenizers, r1_tokenizer, hints, tmp_path):
    """Text prompts (placement assistant) as `mentor train` hands them to TRL (`trl.train.prompt_rows`), and chat
    prompts (placement after) rendered by TRL itself with the round's kwargs: each row starts with the BOS once
    (none for Qwen3, which has none), and a text row's ids are the text's own tokens."""
    from mentor.training.trl.launcher import TrlTrainConfig, select_prompts
    from mentor.training.trl.train import prompt_rows

    folder = r1_tokenizer if family == "r1" else tokenizers[family]
    tok = load(folder)
    out = tmp_path / "prompts"
    BUILD({}, BuildConfig(base=BASE[0], hints=[str(hints)], tokenizer=str(folder), placement="assistant", mode="both"), out)
    cfg = TrlTrainConfig(round=1, round_dir=str(tmp_path / "r"), actor_model=str(folder), prompts=str(out), limit=6)
    rows = prompt_rows(cfg, tok)
    ids = _tokenize_like_trl(tok, [r["prompt"] for r in rows])
    bos = tok.bos_token_id
    for row, got, raw in zip(rows, ids, select_prompts(cfg)["prompt"]):
        assert got == tok(raw, add_special_tokens=False)["input_ids"]  # exactly what the template wrote
        if bos is not None:
            assert got[0] == bos and got[1] != bos
    msg_out = tmp_path / "messages"
    BUILD({}, BuildConfig(base=BASE[0], hints=[str(hints)], placement="after", mode="both"), msg_out)
    chats = pl.read_parquet(msg_out / "part-*.parquet").head(4)["prompt"].to_list()
    for got in _tokenize_like_trl(tok, chats, {"enable_thinking": False}):
        if bos is not None:
            assert got[0] == bos and got[1] != bos


def test_llama_text_prompt_had_two_bos_through_trl(tokenizers, hints, tmp_path):
    """Why `prompt_rows` strips it: TRL tokenizes a string prompt with special tokens, and Llama-3.1's tokenizer
    adds its BOS in front of the one the template wrote."""
    tok = load(tokenizers["llama3_1"])
    plain, _, _ = build_pair(tmp_path, hints, tokenizers["llama3_1"])
    assert _tokenize_like_trl(tok, [plain])[0][:2] == [tok.bos_token_id] * 2


class _Actor:
    """Stands in for OpenRLHF's vLLM actor: keeps the ids it is handed and answers a boxed 18."""

    def __init__(self, tok) -> None:
        self.tok, self.prompts = tok, []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.prompts.append(list(prompt_token_ids))
        ids = self.tok("So \\boxed{18}.", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, text="So \\boxed{18}.", finish_reason="stop", logprobs=None)])


@pytest.mark.parametrize("family", ["llama3_1", "qwen3", "r1"])
def test_one_bos_through_openrlhf_agent_executor(family, tokenizers, r1_tokenizer, hints, tmp_path, monkeypatch):
    """OpenRLHF 0.11.2's SingleTurnAgentExecutor tokenizes build's text without special tokens: one BOS, the
    hint's tokens last."""
    pytest.importorskip("openrlhf")
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from mentor.training.openrlhf.launcher import REWARD_FILE

    folder = r1_tokenizer if family == "r1" else tokenizers[family]
    tok = load(folder)
    plain, hinted, _ = build_pair(tmp_path, hints, folder)
    label = pl.read_parquet(tmp_path / "prompts" / "part-*.parquet").filter(pl.col("hint_id") == "h-egg")["label"][0]
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path / "log"))
    actor = _Actor(tok)
    executor = SingleTurnAgentExecutor(remote_rm_url=str(REWARD_FILE))
    asyncio.run(executor.execute(hinted, label, SimpleNamespace(max_tokens=64, logprobs=None), 4096, tok, actor))
    (sent,) = actor.prompts
    assert sent == tok(hinted, add_special_tokens=False)["input_ids"]
    if tok.bos_token_id is not None:
        assert sent[0] == tok.bos_token_id and sent.count(tok.bos_token_id) == 1
    hint_ids = tok(HINT + "\n\n", add_special_tokens=False)["input_ids"]
    assert sent[-len(hint_ids):] == hint_ids


@pytest.mark.parametrize("family", ["llama3_1", "qwen3"])
def test_one_bos_through_verl_agent_loop_rendering(family, tokenizers, hints, tmp_path):
    """verl 0.9.1 renders chat prompts in its agent loop with the Continuous Token builder and
    ``data.apply_chat_template_kwargs``: one BOS for Llama-3.1, Qwen3's non-thinking block from the kwargs."""
    pytest.importorskip("verl")
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    tok = load(tokenizers[family])
    out = tmp_path / "messages"
    BUILD({}, BuildConfig(base=BASE[0], hints=[str(hints)], placement="after", mode="both"), out)
    builder = create_continuous_token_builder(tok, hf_model_type="llama" if family == "llama3_1" else "qwen3",
                                              chat_template_kwargs={"enable_thinking": False})
    for chat in pl.read_parquet(out / "part-*.parquet").head(4)["prompt"].to_list():
        ids = builder.build_initial_tokens([{"role": m["role"], "content": m["content"]} for m in chat])
        if tok.bos_token_id is not None:
            assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
        else:
            assert tok.decode(ids).endswith("<think>\n\n</think>\n\n")


# --------------------------------------------------------------------------- row 9: through a server


def _rescue_args(root: Path, url: str, problem: dict, hints: Path, *extra: str) -> list[str]:
    pl.read_parquet(bundled("gsm8k_problems.parquet")).filter(pl.col("problem_id") == problem["problem_id"]).write_parquet(
        root / "c.parquet")
    return ["rescue", "--collapsed", str(root / "c.parquet"), "--hints", str(hints), "--out", str(root / "out"), "--k", "2",
            "--backend", "openai", "--policy", "m", "--base-url", url, "--no-progress", *extra]


def test_placement_assistant_through_a_server_sends_the_same_text(tokenizers, hints, problem, tmp_path):
    """`mentor rescue --backend openai --placement assistant --tokenizer QWEN3`: the hinted arm goes to the
    completions API as the very text build writes (thinking mode kept), without added special tokens; the
    unhinted arm to the chat API with the round's kwargs."""
    from fake_openai_server import FakeServer

    with FakeServer() as server:
        res = CliRunner().invoke(cli, _rescue_args(tmp_path, server.url, problem, hints, "--placement", "assistant",
                                                   "--tokenizer", str(tokenizers["qwen3"])), catch_exceptions=False)
        assert res.exit_code == 0, res.output
        texts = [b for b, p in zip(server.seen, server.paths) if p.endswith("/v1/completions")]
        chats = [b for b, p in zip(server.seen, server.paths) if p.endswith("/chat/completions")]
    plain, hinted, _ = build_pair(tmp_path, hints, tokenizers["qwen3"])
    assert len(texts) == 4 and {b["prompt"] for b in texts} == {plain, hinted}
    assert all(b["add_special_tokens"] is False and "messages" not in b for b in texts)
    assert chats == []  # the unhinted arm of a text placement is text too (the same rendering as build's)
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["problems"] == 1


def test_server_max_tokens_never_exceeds_its_max_model_len(tmp_path, caplog):
    """vLLM reports ``max_model_len`` in GET /models and answers a request for more new tokens with a 400: the
    backend asks for at most that many, and says so once."""
    from fake_openai_server import FakeServer, json_reply, model_list

    from mentor.pipeline.llm import GenRequest
    from mentor.pipeline.backends.openai.client import OpenAIBackend

    def chat(body):
        if body["max_tokens"] > 512:
            return json_reply({"error": {"message": f"max_tokens={body['max_tokens']} cannot be greater than max_model_len=512"}}, 400)
        from fake_openai_server import completion
        return json_reply(completion("ok"))

    with FakeServer(chat, models=lambda: json_reply(model_list("m", max_model_len=512))) as server:
        backend = OpenAIBackend("m", server.url, max_retries=0)
        out = backend.generate([GenRequest(str(i), [{"role": "user", "content": "hi"}], max_tokens=4096) for i in range(3)])
        assert [r.finish_reason for r in out] == ["stop"] * 3
        assert {b["max_tokens"] for b in server.seen} == {512}
    assert backend.max_model_len == 512
    assert sum("max_model_len 512" in r.getMessage() for r in caplog.records) == 1


# --------------------------------------------------------------------------- issue 59: templates and options


def _tokenizer_with(template: str, tmp_path: Path, tokenizers) -> Path:
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizers["qwen3"]))
    tok.chat_template = template
    out = tmp_path / "odd-tokenizer"
    tok.save_pretrained(str(out))
    return out


@pytest.mark.parametrize("template, words", [
    ("{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}",
     "writes no assistant turn"),
    ("{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('only user turns') }}{% endif %}"
     "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{{ undefined_macro() }}", "fails on a user chat"),
])
def test_a_template_without_an_assistant_turn_or_that_raises_is_a_clear_error(template, words, tokenizers, hints, tmp_path):
    folder = _tokenizer_with(template, tmp_path, tokenizers)
    res = CliRunner().invoke(cli, ["build", "--base", BASE[0], "--hints", str(hints), "--out", str(tmp_path / "p"),
                                   "--placement", "assistant", "--tokenizer", str(folder)])
    assert res.exit_code == 2, res.output
    assert words in res.output and str(folder) in res.output and "--placement after" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "p").exists()
    with pytest.raises(ConfigError, match=words):
        render_prompt(load(folder), [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "hint"}])


@pytest.mark.parametrize("extra", [["--placement", "after"], [], ["--placement", "system", "--tokenizer", "TOK"]])
def test_answer_template_with_a_placement_it_does_not_apply_to_is_a_usage_error(extra, tokenizers, hints, tmp_path):
    args = [a.replace("TOK", str(tokenizers["qwen3"])) for a in extra]
    res = CliRunner().invoke(cli, ["build", "--base", BASE[0], "--hints", str(hints), "--out", str(tmp_path / "p"),
                                   "--answer-template", "labelled", *args])
    assert res.exit_code == 2, res.output
    assert "--answer-template" in res.output and "placement assistant" in res.output and not (tmp_path / "p").exists()


def test_answer_template_in_rescue_with_a_message_placement_is_refused(hints, problem, tmp_path):
    from fake_openai_server import FakeServer

    with FakeServer() as server:
        res = CliRunner().invoke(cli, _rescue_args(tmp_path, server.url, problem, hints, "--placement", "after",
                                                   "--answer-template", "labelled"))
        assert not server.seen
    assert res.exit_code == 2 and "--answer-template" in res.output and "placement assistant" in res.output, res.output


def test_policy_mode_is_read_from_the_template_not_the_name(tokenizers, r1_tokenizer):
    assert policy_mode(load(tokenizers["qwen3"])) == "thinking"
    assert policy_mode(load(tokenizers["qwen3"]), {"enable_thinking": False}) == "non-thinking"
    assert policy_mode(load(r1_tokenizer)) == "thinking"
    assert policy_mode(load(tokenizers["llama3_1"])) == "no thinking block"
    assert policy_mode(load(tokenizers["deepseek_v3"])) == "no thinking block"


# --------------------------------------------------------------------------- the trainers get the same variables


def test_trainers_are_refused_prompts_built_with_other_template_variables(tokenizers, hints, tmp_path):
    """Prompts built for Qwen3's non-thinking mode: TRL must pass the same ``chat_template_kwargs``, verl the same
    ``data.apply_chat_template_kwargs``; OpenRLHF (no such setting) is refused chat prompts built with them."""
    from mentor.training.openrlhf.launcher import TrainConfig, prompt_data_flags
    from mentor.training.trl.launcher import parse_config as parse_trl
    from mentor.training.trl.launcher import round_spec
    from mentor.training.verl.launcher import parse_config as parse_verl
    from mentor.training.verl.launcher import train_files

    off = {"enable_thinking": False}
    msgs = tmp_path / "messages"
    BUILD({}, BuildConfig(base=BASE[0], hints=[str(hints)], placement="after", tokenizer=str(tokenizers["qwen3"]),
                          chat_template_kwargs=off), msgs)
    rd = str(tmp_path / "round-001")
    with pytest.raises(ConfigError, match=r"built with chat_template_kwargs \{'enable_thinking': False\}.*trainer passes \{\}"):
        round_spec(parse_trl({"round_dir": rd, "prompts": str(msgs), "actor_model": str(tokenizers["qwen3"])}, require_trl=False))
    spec = round_spec(parse_trl({"round_dir": rd, "prompts": str(msgs), "actor_model": str(tokenizers["qwen3"]),
                                 "chat_template_kwargs": off}, require_trl=False))
    assert spec["grpo"]["chat_template_kwargs"] == off
    with pytest.raises(ConfigError, match="data.apply_chat_template_kwargs"):
        train_files(parse_verl({"kind": "verl", "round_dir": rd, "prompts": str(msgs)}))
    assert train_files(parse_verl({"kind": "verl", "round_dir": rd, "prompts": str(msgs),
                                   "overrides": {"data.apply_chat_template_kwargs": off}}))
    with pytest.raises(ConfigError, match="OpenRLHF 0.11.2 renders chat prompts with its template's defaults"):
        prompt_data_flags(TrainConfig(round_dir=rd, base_model=str(tokenizers["qwen3"]), prompts=str(msgs)))
    text = tmp_path / "text"
    BUILD({}, BuildConfig(base=BASE[0], hints=[str(hints)], placement="assistant", tokenizer=str(tokenizers["qwen3"]),
                          chat_template_kwargs=off), text)
    assert "--data.apply_chat_template" not in prompt_data_flags(TrainConfig(round_dir=rd, base_model=str(tokenizers["qwen3"]), prompts=str(text)))


def test_a_workflow_build_takes_the_trainers_template_variables(tokenizers):
    from mentor.workflows.config import validate_workflow
    from mentor.workflows.runner import Runner

    tok = str(tokenizers["qwen3"])
    trl = {"kind": "trl", "config": {"base_model": tok, "chat_template_kwargs": {"enable_thinking": False}}}
    wf = validate_workflow({"name": "w", "base": "gsm8k", "build": {"placement": "assistant", "tokenizer": tok}, "trainer": trl})
    assert Runner.build_settings(SimpleNamespace(wf=wf))["chat_template_kwargs"] == {"enable_thinking": False}
    # an answer template is checked against the placement the round settles (the trainer's policy as tokenizer)
    validate_workflow({"name": "w", "base": "gsm8k", "build": {"answer_template": "labelled"}, "trainer": trl})
    with pytest.raises(ConfigError, match=r"build.chat_template_kwargs \{\} and trainer chat_template_kwargs"):
        validate_workflow({"name": "w", "base": "gsm8k", "build": {"chat_template_kwargs": {}}, "trainer": trl})
    with pytest.raises(ConfigError, match="OpenRLHF 0.11.2"):
        validate_workflow({"name": "w", "base": "gsm8k", "trainer": {"kind": "openrlhf", "config": {"base_model": tok}},
                           "build": {"placement": "after", "chat_template_kwargs": {"enable_thinking": False}}})


def test_rollout_samples_chat_prompts_with_the_variables_they_were_built_with(tokenizers, hints, tmp_path):
    """`mentor rollout` of chat prompts built for Qwen3's non-thinking mode sends their variables to the server's
    chat API (``chat_template_kwargs``); other variables on the command line are refused."""
    from fake_openai_server import FakeServer

    out = tmp_path / "prompts"
    BUILD({}, BuildConfig(base=BASE[0], hints=[str(hints)], placement="after", tokenizer=str(tokenizers["qwen3"]),
                          chat_template_kwargs={"enable_thinking": False}), out)
    args = ["rollout", str(out), "--k", "1", "--limit", "2", "--backend", "openai", "--policy", "m", "--no-progress"]
    with FakeServer() as server:
        res = CliRunner().invoke(cli, [*args, "--base-url", server.url, "--out", str(tmp_path / "r1")], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        assert len(server.seen) == 2 and all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in server.seen)
        res = CliRunner().invoke(cli, [*args, "--base-url", server.url, "--out", str(tmp_path / "r2"),
                                       "--chat-template-kwarg", "enable_thinking=true"])
        assert res.exit_code == 2 and "built with chat_template_kwargs {'enable_thinking': False}" in res.output, res.output
        assert len(server.seen) == 2


def test_a_template_without_an_assistant_turn_is_refused_before_any_unhinted_text_prompt(tokenizers, tmp_path):
    """Without hints every row is unhinted: with placement assistant each would be text ending at the user's turn
    (no assistant turn for the policy to answer in); refused before any shard is written."""
    folder = _tokenizer_with("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
                             tmp_path, tokenizers)
    res = CliRunner().invoke(cli, ["build", "--base", BASE[0], "--out", str(tmp_path / "p"), "--placement", "assistant",
                                   "--tokenizer", str(folder)])
    assert res.exit_code == 2 and "writes no assistant turn" in res.output and not (tmp_path / "p").exists(), res.output


def test_vouching_answer_template_with_a_message_placement_is_refused():
    from mentor.stages.hint.config import load_config

    with pytest.raises(ConfigError, match="answer_template applies to placement assistant"):
        load_config(None, vouch={"placement": "after", "answer_template": "labelled"})
