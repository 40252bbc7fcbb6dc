"""`mentor build`: prompt shards on the real bundled problem sets, loaded as the trainers load them.

Over 500 lines: every placement and template is checked through each trainer's own loader
(OpenRLHF, verl, TRL), and those checks share this file's fixtures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.ids import text_id
from mentor.pipeline.io import sha256_file
from mentor.pipeline.schemas import PROMPTS, conform, parse_prompt_label, prompt_label
from mentor.stages.build import DEFAULT_INSTRUCTIONS, BUILD, BuildConfig


# --------------------------------------------------------------------------- helpers


def make_hints(rows: list[dict], path: Path) -> Path:
    """A HINTS dataset from a few fields per row (the rest filled like the hint stage does)."""
    full = []
    for r in rows:
        full.append(
            {
                "problem_id": r["problem_id"],
                "round": r.get("round", 0),
                "hint_id": r.get("hint_id") or f"h-{abs(hash((r['problem_id'], r['hint']))) % 10**12:012d}",
                "hint": r["hint"],
                "keywords": r.get("keywords", ["ratio"]),
                "error": r.get("error"),
                "status": r.get("status", "accepted"),
                "retries": r.get("retries", 0),
                "refines": r.get("refines", 0),
                "judge_score": r.get("judge_score", 0.9),
                "violations": r.get("violations", []),
                "trace": [],
                "model": "test",
                "prompt_version": "v-test",
                "config_hash": "c-test",
            }
        )
    table = pa.Table.from_pylist(full) if full else pa.table({"problem_id": pa.array([], pa.string())})
    table = conform(table, "hints")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def gsm8k_ids(n: int, offset: int = 0) -> list[str]:
    from mentor.data import bundled

    return pl.read_parquet(bundled("gsm8k_problems.parquet")).get_column("problem_id").slice(offset, n).to_list()


def read_prompts(out: Path) -> pl.DataFrame:
    return pl.read_parquet(sorted(out.glob("part-*.parquet")))


@pytest.fixture(scope="module")
def gsm8k_hints(tmp_path_factory, gsm8k_collapsed) -> Path:
    """Hints for 20 real collapsed GSM8K problems (hand-built HINTS rows)."""
    ids = pl.read_parquet(gsm8k_collapsed).get_column("problem_id").sort().head(20).to_list()
    rows = [
        {"problem_id": pid, "hint": f"Track each quantity separately; write what changes at step {i % 3 + 1}.",
         "hint_id": f"h-{i:04d}", "status": ("accepted", "repaired", "fallback")[i % 3]}
        for i, pid in enumerate(ids)
    ]
    return make_hints(rows, tmp_path_factory.mktemp("hints") / "hints.parquet")


@pytest.fixture(scope="module")
def built(tmp_path_factory, gsm8k_hints) -> Path:
    out = tmp_path_factory.mktemp("prompts") / "prompts"
    BUILD({}, BuildConfig(base="gsm8k", hints=[str(gsm8k_hints)], shard_rows=500), out)
    return out


# --------------------------------------------------------------------------- the shards


def test_every_base_problem_gets_one_prompt_and_the_hint_follows_the_problem(built, gsm8k_hints):
    df = read_prompts(built)
    hints = pl.read_parquet(gsm8k_hints)
    assert df.height == 1319 and df.get_column("problem_id").n_unique() == 1319
    assert sorted(df.get_column("problem_id")) == sorted(gsm8k_ids(1319))
    hinted = df.filter(pl.col("hint_id").is_not_null())
    assert hinted.height == 20
    assert set(hinted.get_column("problem_id")) == set(hints.get_column("problem_id"))
    by_id = {r["problem_id"]: r for r in hints.iter_rows(named=True)}
    from mentor.data import bundled

    problems = {r["problem_id"]: r for r in pl.read_parquet(bundled("gsm8k_problems.parquet")).iter_rows(named=True)}
    for row in df.iter_rows(named=True):
        msgs = row["prompt"]
        assert [m["role"] for m in msgs] == ["user"]
        user = msgs[0]["content"]
        problem = problems[row["problem_id"]]["problem"]
        instruction = DEFAULT_INSTRUCTIONS["math"]
        if row["hint_id"]:
            h = by_id[row["problem_id"]]
            assert user == f"{problem}\n\nHint: {h['hint']}\n\n{instruction}"  # the default placement, "after"
            assert row["hint_id"] == h["hint_id"]
        else:
            assert user == f"{problem}\n\n{instruction}"
        # The label is exactly the schema's prompt_label: the reward functions parse it.
        ref = problems[row["problem_id"]]["label"]
        assert row["label"] == prompt_label("math", ref, row["problem_id"], row["hint_id"], 1)
        lab = parse_prompt_label(row["label"])
        assert lab["problem_id"] == row["problem_id"] and lab["hint_id"] == row["hint_id"] and lab["round"] == 1
        assert row["reward_model"] == {"style": "rule", "ground_truth": ref}
        assert row["extra_info"]["problem_id"] == row["problem_id"] and row["extra_info"]["round"] == 1
        assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math" and row["round"] == 1
    assert df.get_column("extra_info").struct.field("index").to_list() == list(range(1319))


def test_shards_schema_manifest_stats_and_card(built, gsm8k_hints):
    shards = sorted(built.glob("part-*.parquet"))
    assert [s.name for s in shards] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [pq.ParquetFile(s).metadata.num_rows for s in shards] == [500, 500, 319]
    for s in shards:
        schema = pq.read_schema(s)
        assert schema.names == PROMPTS.names
        for f in PROMPTS:
            assert _shape(schema.field(f.name).type) == _shape(f.type), f.name
        assert schema.metadata[b"mentor.dataset"] == b"prompts"
    m = json.loads((built / "manifest.json").read_text())
    assert m["rows"] == 1319 and m["dataset"] == "prompts" and m["schema_version"] == "1"
    assert [(x["path"], x["rows"], x["sha256"]) for x in m["shards"]] == [
        (s.name, pq.ParquetFile(s).metadata.num_rows, sha256_file(s)) for s in shards
    ]
    inputs = {Path(x["path"]).name: x["sha256"] for x in m["inputs"]}
    assert inputs["hints.parquet"] == sha256_file(gsm8k_hints) and "gsm8k_problems.parquet" in inputs
    assert m["config"]["base"] == "gsm8k" and m["config"]["shard_rows"] == 500 and m["round"] == 1
    stats = json.loads((built / "stats.json").read_text())
    assert stats["rows"] == 1319 and stats["hinted_rows"] == 20 and stats["base_problems"] == 1319
    assert stats["hints_used"] == 20 and stats["hints_unmatched"] == 0 and stats["shards"] == 3
    assert "configs:" in (built / "README.md").read_text()
    assert not [p for p in built.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_mode_both_keeps_the_unhinted_prompt_beside_the_hinted(tmp_path, gsm8k_hints):
    out = tmp_path / "both"
    st = BUILD({},
               BuildConfig(base="gsm8k", hints=[str(gsm8k_hints)], mode="both", system_prompt="You are a careful solver."),
               out)
    df = read_prompts(out)
    assert df.height == 1319 + 20 and st.rows == 1339 and st.hinted_rows == 20 and st.unhinted_rows == 1319
    hinted_ids = set(df.filter(pl.col("hint_id").is_not_null()).get_column("problem_id"))
    hint_of = {r["problem_id"]: r["hint"] for r in pl.read_parquet(gsm8k_hints).iter_rows(named=True)}
    rows = df.to_dicts()
    for i, row in enumerate(rows):
        assert row["prompt"][0] == {"role": "system", "content": "You are a careful solver."}
        if row["hint_id"]:
            prev = rows[i - 1]  # the unhinted twin comes right before
            assert prev["problem_id"] == row["problem_id"] and prev["hint_id"] is None
            problem, instruction = prev["prompt"][1]["content"].rsplit("\n\n", 1)
            assert row["prompt"][1]["content"] == f"{problem}\n\nHint: {hint_of[row['problem_id']]}\n\n{instruction}"
    assert df.group_by("problem_id").len().filter(pl.col("len") == 2).height == len(hinted_ids) == 20


def test_same_inputs_and_seed_give_identical_bytes(tmp_path, gsm8k_hints):
    def shard_bytes(out: Path) -> list[bytes]:
        return [p.read_bytes() for p in sorted(out.glob("part-*.parquet"))]

    cfg = BuildConfig(base="gsm8k", hints=[str(gsm8k_hints)], shard_rows=400, mode="both")
    BUILD({}, cfg, tmp_path / "a")
    BUILD({}, cfg, tmp_path / "b")
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    seeded = cfg.model_copy(update={"seed": 7})
    BUILD({}, seeded, tmp_path / "s1")
    BUILD({}, seeded, tmp_path / "s2")
    assert shard_bytes(tmp_path / "s1") == shard_bytes(tmp_path / "s2")
    assert shard_bytes(tmp_path / "s1") != shard_bytes(tmp_path / "a")
    a, s = read_prompts(tmp_path / "a"), read_prompts(tmp_path / "s1")
    assert a.get_column("problem_id").to_list() != s.get_column("problem_id").to_list()
    assert sorted(a.get_column("label")) == sorted(s.get_column("label"))  # same rows, shuffled
    assert s.get_column("extra_info").struct.field("index").to_list() == list(range(s.height))
    # The manifests' shard hashes agree too.
    ma, mb = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("a", "b"))
    assert ma["shards"] == mb["shards"]


def test_shard_bytes_and_stale_shards_are_removed(tmp_path):
    out = tmp_path / "p"
    BUILD({}, BuildConfig(base="gsm8k", shard_rows=100), out)
    assert len(list(out.glob("part-*.parquet"))) == 14
    BUILD({}, BuildConfig(base="gsm8k", shard_bytes=200_000), out)
    shards = sorted(out.glob("part-*.parquet"))
    m = json.loads((out / "manifest.json").read_text())
    assert 1 < len(shards) < 14 and [s["path"] for s in m["shards"]] == [s.name for s in shards]
    assert sum(pq.ParquetFile(s).metadata.num_rows for s in shards) == 1319
    with pytest.raises(ValueError, match="not both"):
        BuildConfig(base="gsm8k", shard_rows=10, shard_bytes=100_000)


def test_math500_and_humaneval_labels(tmp_path):
    from mentor.data import bundled

    for name, domain in (("math500", "math"), ("humaneval", "code")):
        out = tmp_path / name
        BUILD({}, BuildConfig(base=name), out)
        df = read_prompts(out)
        base = pl.read_parquet(bundled(f"{name}_problems.parquet"))
        assert df.height == base.height
        ref = dict(zip(base["problem_id"], base["label"]))
        for row in df.iter_rows(named=True):
            assert row["label"] == prompt_label(domain, ref[row["problem_id"]], row["problem_id"], None, 0)
            assert row["ability"] == domain and row["reward_model"]["ground_truth"] == ref[row["problem_id"]]
            assert row["prompt"][-1]["content"].endswith(DEFAULT_INSTRUCTIONS[domain])
        if domain == "code":
            lab = parse_prompt_label(df["label"][0])
            assert {"tests", "entry_point", "kind"} <= set(lab) and "check(" in lab["tests"]


def test_labels_escape_like_json_dumps(tmp_path):
    nasty = 'a "quoted" \\ back\nslash\ttab \x01 é 😀 \\frac{1}{2}'
    base = pl.DataFrame(
        {"problem_id": ["q1", "q2"], "domain": ["math", "math"], "problem": ["Solve {x}.", "Two"],
         "label": [nasty, "3"], "data_source": ["t", "t"]}
    )
    base.write_parquet(tmp_path / "b.parquet")
    hints = make_hints([{"problem_id": "q1", "hint": 'Use "half" of {x}', "hint_id": 'h"1'}], tmp_path / "h.parquet")
    out = tmp_path / "o"
    # One row per shard: the escapes are found in the whole set and apply to each shard's slice.
    BUILD({}, BuildConfig(base=str(tmp_path / "b.parquet"), hints=[str(hints)], round=3, shard_rows=1), out)
    df = read_prompts(out)
    assert len(list(out.glob("part-*.parquet"))) == 2
    for row in df.iter_rows(named=True):
        r = base.filter(pl.col("problem_id") == row["problem_id"]).row(0, named=True)
        assert row["label"] == prompt_label("math", r["label"], r["problem_id"], row["hint_id"], 3)
    assert df["prompt"][0][0]["content"].startswith('Solve {x}.\n\nHint: Use "half" of {x}\n\n')


def test_user_template_file_and_instruction_placement(tmp_path, gsm8k_hints):
    tpl = tmp_path / "t.txt"
    tpl.write_text("{problem}\n\n{instruction}\n\n(A teacher's hint: {hint}) \\boxed{}")
    out = tmp_path / "o"
    r = CliRunner().invoke(
        cli, ["build", "--base", "gsm8k", "--hints", str(gsm8k_hints), "--out", str(out), "--template", str(tpl),
              "--instruction", "math=Answer in \\boxed{}.", "--system", "sys"],
    )
    assert r.exit_code == 0, r.output
    df = read_prompts(out)
    h = df.filter(pl.col("hint_id").is_not_null()).row(0, named=True)
    user = h["prompt"][1]["content"]
    assert user.endswith(") \\boxed{}") and "\n\nAnswer in \\boxed{}.\n\n(A teacher's hint: Track each" in user
    plain = df.filter(pl.col("hint_id").is_null()).row(0, named=True)["prompt"][1]["content"]
    assert plain.endswith("\n\nAnswer in \\boxed{}.") and "hint" not in plain
    m = json.loads((out / "manifest.json").read_text())
    assert any(Path(x["path"]).name == "t.txt" for x in m["inputs"])
    bad = tmp_path / "bad.txt"
    bad.write_text("{problem} only")
    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--out", str(tmp_path / "x"), "--template", str(bad)])
    assert r.exit_code == 2 and "{hint}" in r.output


@pytest.mark.parametrize("template", ["Hint: {hint}\n\n{problem}", "{problem}\n\n{instruction}\n\n(A teacher's hint: {hint}) \\boxed{}",
                                      "{instruction} {hint} {problem}"])
def test_user_messages_are_the_shared_layout(tmp_path, gsm8k_hints, template):
    """What build writes is the documented layout (pipeline/prompts.py), computed here in plain Python."""
    from mentor.data import bundled

    out = tmp_path / "o"
    BUILD({}, BuildConfig(base="gsm8k", hints=[str(gsm8k_hints)], template=template, mode="both"), out)
    hints = {r["problem_id"]: r["hint"] for r in pl.read_parquet(gsm8k_hints).iter_rows(named=True)}
    problems = dict(pl.read_parquet(bundled("gsm8k_problems.parquet")).select("problem_id", "problem").iter_rows())
    for row in read_prompts(out).iter_rows(named=True):
        hint = hints[row["problem_id"]] if row["hint_id"] else None
        want = _user_message(problems[row["problem_id"]], DEFAULT_INSTRUCTIONS["math"], hint, template)
        assert row["prompt"][-1]["content"] == want


def _user_message(problem: str, instruction: str, hint: str | None, template: str) -> str:
    """The layout's rule, independent of build's polars expressions: the template (hinted) or {problem}, only the
    three placeholders filled, the instruction appended after a blank line where the template does not place it."""
    text = template if hint is not None else "{problem}"
    body = re.sub(r"\{(hint|problem|instruction)\}", lambda m: {"hint": hint or "", "problem": problem,
                                                                "instruction": instruction}[m.group(1)], text)
    return body if "{instruction}" in text else body + "\n\n" + instruction


# --------------------------------------------------------------------------- where the hint goes


def _placed(tmp_path, gsm8k_hints, placement, **kw):
    out = tmp_path / f"p-{placement}"
    BUILD({}, BuildConfig(base="gsm8k", hints=[str(gsm8k_hints)], placement=placement, mode="both", **kw), out)
    return read_prompts(out)


@pytest.mark.parametrize("placement", ["before", "after", "system"])
def test_each_placement_puts_the_hint_where_it_says(tmp_path, gsm8k_hints, placement):
    from mentor.data import bundled

    df = _placed(tmp_path, gsm8k_hints, placement)
    hints = {r["problem_id"]: r["hint"] for r in pl.read_parquet(gsm8k_hints).iter_rows(named=True)}
    problems = dict(pl.read_parquet(bundled("gsm8k_problems.parquet")).select("problem_id", "problem").iter_rows())
    inst = DEFAULT_INSTRUCTIONS["math"]
    hinted = df.filter(pl.col("hint_id").is_not_null())
    assert hinted.height == 20
    for row in df.iter_rows(named=True):
        problem, msgs = problems[row["problem_id"]], row["prompt"]
        if not row["hint_id"]:
            assert msgs == [{"role": "user", "content": f"{problem}\n\n{inst}"}]
            continue
        hint = hints[row["problem_id"]]
        want = {
            "before": [{"role": "user", "content": f"Hint: {hint}\n\n{problem}\n\n{inst}"}],
            "after": [{"role": "user", "content": f"{problem}\n\nHint: {hint}\n\n{inst}"}],
            "system": [{"role": "system", "content": f"Hint: {hint}"}, {"role": "user", "content": f"{problem}\n\n{inst}"}],
        }[placement]
        assert msgs == want
    # A system prompt of the user's stays first; the hint joins it.
    sysd = _placed(tmp_path / "s", gsm8k_hints, placement, system_prompt="You are a careful solver.")
    one = sysd.filter(pl.col("hint_id").is_not_null()).row(0, named=True)["prompt"]
    assert one[0]["role"] == "system" and one[0]["content"].startswith("You are a careful solver.")
    assert (f"Hint: {hints[sysd.filter(pl.col('hint_id').is_not_null()).row(0, named=True)['problem_id']]}" in one[0]["content"]) == (
        placement == "system")


def test_placement_is_checked_and_a_template_goes_without_it(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="placement"):
        BuildConfig(base="gsm8k", placement="solution")
    with pytest.raises(ValidationError, match="a template or a placement"):
        BuildConfig(base="gsm8k", placement="after", template="{hint} {problem}")
    tpl = tmp_path / "t.txt"
    tpl.write_text("{hint} -- {problem}")
    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--out", str(tmp_path / "x"), "--placement", "after", "--template", str(tpl)])
    assert r.exit_code != 0 and "--placement or --template" in r.output
    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--out", str(tmp_path / "y"), "--placement", "solution"])
    assert r.exit_code == 2 and "solution" in r.output


@pytest.mark.parametrize("placement", ["before", "after", "system"])
def test_rescue_re_rolls_the_prompts_build_writes(tmp_path, gsm8k_hints, gsm8k_collapsed, placement):
    """One layout: `mentor rescue`'s hinted and unhinted prompts are build's, message for message."""
    from mentor.stages.rescue import rescue_items
    from mentor.stages.rollout import RolloutConfig

    df = _placed(tmp_path, gsm8k_hints, placement)
    collapsed = pl.read_parquet(gsm8k_collapsed)
    items, kept, _ = rescue_items(collapsed, {"h": pl.read_parquet(gsm8k_hints)}, RolloutConfig(placement=placement))
    assert len(kept) == 20
    built_rows = {(r["problem_id"], r["hint_id"]): r["prompt"] for r in df.iter_rows(named=True)}
    for it in items:
        assert it.messages == built_rows[(it.problem_id, it.hint_id)], (it.arm, it.problem_id)


@pytest.mark.parametrize("placement", ["before", "after", "system"])
def test_ingest_recovers_the_problem_from_each_placement(tmp_path, gsm8k_hints, placement):
    """A logged prompt of any placement gives back its problem (ingest's last resort when no problem set names the id)."""
    from mentor.data import bundled
    from mentor.stages.ingest_problems import recover_problem

    tok = _chat_tokenizer()
    df = _placed(tmp_path, gsm8k_hints, placement).filter(pl.col("hint_id").is_not_null())
    problems = dict(pl.read_parquet(bundled("gsm8k_problems.parquet")).select("problem_id", "problem").iter_rows())
    for row in df.iter_rows(named=True):
        sent = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        want = problems[row["problem_id"]]
        assert recover_problem(sent, row["problem_id"], row["hint_id"], knows_hint=True) == want
        assert recover_problem(sent, "gsm8k/123", row["hint_id"], knows_hint=True) == want  # an id that is not a text hash
        assert recover_problem(sent) == want  # verl: no id, no hint id


def _chat_tokenizer():
    from transformers import AutoTokenizer

    from mentor.pipeline.models import ensure_embedded_model

    try:
        return AutoTokenizer.from_pretrained(str(ensure_embedded_model()))
    except Exception as exc:  # the model package is part of the cpu extra
        pytest.skip(f"embedded model unavailable: {exc}")


def _check_rendered(text: str, placement: str, hint: str, problem: str, system_prompt: str | None = None) -> None:
    """The hint is in the turn and at the side of the problem that `placement` names, once; the text ends
    with the assistant's generation prompt (ChatML: SmolLM2, like the Qwen models)."""
    assert text.count(f"Hint: {hint}") == 1, text
    assert text.endswith("<|im_start|>assistant\n"), text[-80:]
    user = text.rindex("<|im_start|>user\n")
    at, p = text.index(f"Hint: {hint}"), text.index(problem)
    if placement == "before":
        assert user < at < p
    elif placement == "after":
        assert user < p < at < text.index(DEFAULT_INSTRUCTIONS["math"])
    else:
        assert text.startswith("<|im_start|>system\n") and at < user < p
        assert "SmolLM" not in text  # the hint's system message replaces the template's default one


@pytest.mark.openrlhf
@pytest.mark.parametrize("placement", ["before", "after", "system"])
def test_openrlhf_prompt_dataset_reads_each_placement(tmp_path, gsm8k_hints, placement):
    """OpenRLHF 0.11.2's own loader (blending_datasets + PromptDataset, --data.apply_chat_template)."""
    pytest.importorskip("openrlhf")
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets

    tok = _chat_tokenizer()
    out = tmp_path / "o"
    BUILD({}, BuildConfig(base="gsm8k", hints=[str(gsm8k_hints)], placement=placement), out)
    args = SimpleNamespace(use_ms=False, data=SimpleNamespace(input_key="prompt", label_key="label", apply_chat_template=True,
                                                              image_key="images"))
    strategy = SimpleNamespace(args=args, print=lambda *a, **k: None, is_rank_0=lambda: False)
    dataset = PromptDataset(blending_datasets(str(out), None, strategy, dataset_split="train"), tok, strategy)
    rows = read_prompts(out)
    hints = {r["problem_id"]: r["hint"] for r in pl.read_parquet(gsm8k_hints).iter_rows(named=True)}
    seen = 0
    for i, row in enumerate(rows.iter_rows(named=True)):
        if row["hint_id"] is None:
            continue
        _, prompt, label, _ = dataset[i]
        problem = row["prompt"][-1]["content"].split("\n\n")[0 if placement != "before" else 1]
        _check_rendered(prompt, placement, hints[row["problem_id"]], problem)
        assert json.loads(label)["hint_id"] == row["hint_id"]
        seen += 1
    assert seen == 20


@pytest.mark.parametrize("placement", ["before", "after", "system"])
def test_trl_and_verl_render_each_placement(tmp_path, gsm8k_hints, placement):
    """TRL 1.16's GRPOTrainer._tokenize_prompts (its own code, on a stand-in `self`) and verl's RLHFDataset
    call (``tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)`` on rows
    read with datasets' parquet loader) give the layout the placement names."""
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl import GRPOTrainer

    tok = _chat_tokenizer()
    out = tmp_path / "o"
    BUILD({}, BuildConfig(base="gsm8k", hints=[str(gsm8k_hints)], placement=placement), out)
    ds = datasets.load_dataset("parquet", data_files=str(out / "part-*.parquet"), split="train", cache_dir=str(tmp_path / "c"))
    hinted = ds.filter(lambda r: r["hint_id"] is not None)
    assert len(hinted) == 20
    hints = {r["problem_id"]: r["hint"] for r in pl.read_parquet(gsm8k_hints).iter_rows(named=True)}
    stand_in = SimpleNamespace(processing_class=tok, _is_vlm=False, environment_factories=None, tools=None, chat_template=None,
                               chat_template_kwargs={})
    ids, _, _ = GRPOTrainer._tokenize_prompts(stand_in, [r["prompt"] for r in hinted])
    assert trl.__version__.startswith("1.16")
    for row, prompt_ids in zip(hinted, ids):
        problem = row["prompt"][-1]["content"].split("\n\n")[0 if placement != "before" else 1]
        for text in (tok.decode(prompt_ids), tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)):
            _check_rendered(text, placement, hints[row["problem_id"]], problem)


def test_a_solution_prefix_is_not_continued_by_the_trainers_loaders():
    """Why placement assistant is written as text, not messages: a final assistant message is rendered as a
    finished turn, then a fresh assistant turn starts (OpenRLHF and verl: add_generation_prompt=True; TRL's
    GRPOTrainer the same), so the policy would never continue the prefix (tests/test_build_text.py)."""
    pytest.importorskip("trl")
    from trl import GRPOTrainer

    tok = _chat_tokenizer()
    msgs = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "First add 2 and 3"}]
    stand_in = SimpleNamespace(processing_class=tok, _is_vlm=False, environment_factories=None, tools=None, chat_template=None,
                               chat_template_kwargs={})
    ids, _, _ = GRPOTrainer._tokenize_prompts(stand_in, [msgs])
    for text in (tok.decode(ids[0]), tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)):
        assert text.endswith("First add 2 and 3<|im_end|>\n<|im_start|>assistant\n")


# --------------------------------------------------------------------------- how the trainers load them


def test_datasets_loads_files_glob_and_the_directory(built, tmp_path):
    datasets = pytest.importorskip("datasets")
    files = [str(p) for p in sorted(built.glob("part-*.parquet"))]
    cache = str(tmp_path / "hf-cache")  # a fresh cache: never an Arrow copy of an earlier build
    by_files = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=cache)
    by_glob = datasets.load_dataset("parquet", data_files=str(built / "part-*.parquet"), split="train", cache_dir=cache)
    # As OpenRLHF does for a directory: load_dataset(DIR). Without the README card
    # datasets would pick manifest.json/stats.json (more .json than .parquet files).
    by_dir = datasets.load_dataset(str(built), split="train", cache_dir=cache)
    for ds in (by_files, by_glob, by_dir):
        assert ds.num_rows == 1319
        assert ds.column_names == PROMPTS.names
    row = next(r for r in by_dir if r["hint_id"])
    assert row["prompt"][0]["role"] == "user" and "\n\nHint: " in row["prompt"][0]["content"]
    assert parse_prompt_label(row["label"])["problem_id"] == row["problem_id"]
    assert by_files.features["prompt"] == by_dir.features["prompt"]


def verl_reference_table(tmp_path: Path) -> pa.Schema:
    """The layout verl's examples/data_preprocess/gsm8k.py writes, made the same way
    (a datasets.Dataset mapped to verl's dict layout, then Dataset.to_parquet) on real GSM8K rows."""
    datasets = pytest.importorskip("datasets")
    from mentor.data import bundled

    raw = pl.read_parquet(bundled("gsm8k_problems.parquet")).head(3)
    ds = datasets.Dataset.from_dict({"question": raw["problem"].to_list(), "answer": raw["label"].to_list()})

    def to_verl(example, idx):
        return {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": example["question"]}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": example["answer"]},
            "extra_info": {"split": "train", "index": idx, "answer": example["answer"], "question": example["question"]},
        }

    mapped = ds.map(to_verl, with_indices=True, remove_columns=["question", "answer"])
    mapped.to_parquet(str(tmp_path / "verl.parquet"))
    return pq.read_schema(tmp_path / "verl.parquet")


def _shape(t: pa.DataType):
    """Type structure with struct fields as a name->type map (field order and list item names ignored)."""
    if pa.types.is_struct(t):
        return {t.field(i).name: _shape(t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return ["list", _shape(t.value_type)]
    return str(t)


def test_verl_columns_match_verls_gsm8k_layout(built, tmp_path):
    verl = verl_reference_table(tmp_path)
    ours = pq.read_schema(next(built.glob("part-*.parquet")))
    for name in ("data_source", "prompt", "ability", "reward_model", "extra_info"):
        assert name in ours.names
    for name in ("data_source", "prompt", "ability", "reward_model"):
        assert _shape(ours.field(name).type) == _shape(verl.field(name).type), name
    # extra_info: a struct in both, with verl's int64 index; ours carries the ids instead of the raw text.
    assert pa.types.is_struct(ours.field("extra_info").type) and pa.types.is_struct(verl.field("extra_info").type)
    assert _shape(ours.field("extra_info").type)["index"] == _shape(verl.field("extra_info").type)["index"] == "int64"
    assert set(_shape(ours.field("extra_info").type)) == {"problem_id", "hint_id", "round", "index"}


@pytest.fixture(scope="module")
def chat_tokenizer():
    """SmolLM2's tokenizer (with its chat template), from the converted embedded model if present, else from the GGUF."""
    transformers = pytest.importorskip("transformers")
    from mentor.pipeline import models

    converted = models.embedded_model_dir()
    if models.is_converted(converted):
        return transformers.AutoTokenizer.from_pretrained(str(converted))
    gguf = models.embedded_gguf()
    return transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.mark.openrlhf
def test_openrlhf_prompt_dataset_reads_the_shard_directory(built, gsm8k_hints, chat_tokenizer):
    pytest.importorskip("openrlhf.datasets")
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets

    args = SimpleNamespace(
        data=SimpleNamespace(input_key="prompt", label_key="label", apply_chat_template=True, image_key="images"),
        use_ms=False,
    )
    strategy = SimpleNamespace(args=args, print=lambda *a, **k: None, is_rank_0=lambda: True)
    # As prepare_datasets in openrlhf/trainer/ppo_trainer.py: blending_datasets on
    # --data.prompt_dataset (our shard directory), then PromptDataset.
    data = blending_datasets(str(built), None, strategy, 42, max_count=10**8, dataset_split="train")
    dataset = PromptDataset(data, chat_tokenizer, strategy, input_template=None)
    assert len(dataset) == 1319
    hints = {r["problem_id"]: r["hint"] for r in pl.read_parquet(gsm8k_hints).iter_rows(named=True)}
    seen = 0
    for i in range(len(dataset)):
        datasource, prompt, label, _image = dataset[i]
        pid = parse_prompt_label(label)["problem_id"]
        assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
        if pid in hints:
            seen += 1
            assert f"Hint: {hints[pid]}\n\n" in prompt
            assert parse_prompt_label(label)["hint_id"] is not None
        else:
            assert "Hint:" not in prompt
    assert seen == 20
    batch = dataset.collate_fn([dataset[0], dataset[1]])
    assert len(batch[1]) == 2 and parse_prompt_label(batch[2][0])["problem_id"]
    # A single shard file, as --data.prompt_dataset FILE.parquet.
    one = blending_datasets(str(sorted(built.glob("part-*.parquet"))[0]), None, strategy, 42, dataset_split="train")
    assert len(PromptDataset(one, chat_tokenizer, strategy)) == 500


# --------------------------------------------------------------------------- base sets


def test_local_jsonl_needs_a_map_and_then_matches_bundled_ids(tmp_path, shared_data):
    src = shared_data / "gsm8k" / "test.jsonl"
    with pytest.raises(DataError) as err:
        BUILD({}, BuildConfig(base=str(src)), tmp_path / "x")
    msg = str(err.value)
    assert "test.jsonl" in msg and "'problem'" in msg and "'label'" in msg
    assert "--map problem=question" in msg and "--map label=answer" in msg
    out = tmp_path / "o"
    r = CliRunner().invoke(cli, ["build", "--base", str(src), "--map", "problem=question", "--map", "label=answer",
                                 "--answer-after", "####", "--out", str(out)])
    assert r.exit_code == 0, r.output
    df = read_prompts(out)
    # Same ids as the bundled GSM8K set (text_id of the question), so the hints of a run apply,
    # and with --answer-after the same reference answers as the bundled set.
    from mentor.data import bundled

    ref = pl.read_parquet(bundled("gsm8k_problems.parquet")).select("problem_id", "label")
    got = df.select("problem_id", pl.col("reward_model").struct.field("ground_truth").alias("truth"))
    joined = got.join(ref, on="problem_id")
    assert joined.height == df.height == 1319 and (joined["truth"] == joined["label"]).all()
    assert set(df["data_source"]) == {"test"}
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").glob("part-*"))


def test_hugging_face_dataset_offline_says_not_cached(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    r = CliRunner().invoke(cli, ["build", "--base", "hf:openai/gsm8k:main:test", "--map", "problem=question",
                                 "--map", "label=answer", "--out", str(tmp_path / "o")])
    assert r.exit_code == 1
    assert "not in the local cache" in r.output and "offline" in r.output and "openai/gsm8k" in r.output
    assert not (tmp_path / "o").exists()
    r = CliRunner().invoke(cli, ["build", "--base", "hf:onlyname", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "hf:NAME:SPLIT" in r.output


def test_hugging_face_dataset_through_datasets(tmp_path, monkeypatch):
    """The hf: path runs datasets.load_dataset; a local dataset folder stands in for a cached hub dataset."""
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    folder = tmp_path / "gsm8k_local"
    folder.mkdir()
    from mentor.data import bundled

    raw = pl.read_parquet(bundled("gsm8k_problems.parquet")).head(50).select(
        pl.col("problem").alias("question"), pl.col("label").alias("final")
    )
    raw.write_parquet(folder / "test-00000-of-00001.parquet")
    out = tmp_path / "o"
    st = BUILD({}, BuildConfig(base=f"hf:{folder}:test", mapping={"problem": "question", "label": "final"}), out)
    df = read_prompts(out)
    assert st.rows == 50 and df["problem_id"].to_list() == gsm8k_ids(50)
    m = json.loads((out / "manifest.json").read_text())
    assert m["base"]["kind"] == "hf" and m["base"]["split"] == "test"


def test_bad_inputs(tmp_path, gsm8k_hints):
    # Unknown bundled name / missing file: a usage error.
    with pytest.raises(ConfigError, match="bundled"):
        BUILD({}, BuildConfig(base="gsm9k"), tmp_path / "x")
    # Duplicate problem ids: an error naming the file and the ids.
    dup = pl.DataFrame({"problem_id": ["a", "b", "a"], "domain": ["math"] * 3, "problem": ["1", "2", "3"],
                        "label": ["1", "2", "3"], "data_source": ["t"] * 3})
    dup.write_parquet(tmp_path / "dup.parquet")
    with pytest.raises(DataError) as err:
        BUILD({}, BuildConfig(base=str(tmp_path / "dup.parquet")), tmp_path / "x")
    assert "dup.parquet" in str(err.value) and "duplicate problem_id" in str(err.value) and "a" in str(err.value)
    # Rows without a label or problem: dropped and counted, an error with --strict.
    # Blank in any Unicode whitespace is missing; a problem that only starts with a space is kept.
    # A null domain is unknown; a null data_source is set to the set's name, counted.
    holes = pl.DataFrame({"problem_id": ["a", "b", "c", "d", "e", "f", "g"],
                          "domain": ["math", "math", "math", "chem", "math", "math", None],
                          "problem": ["1", "  ", "3", "4", "\u2003\u3000\n", " 6 eggs", "7"], "label": ["1", "2", None, "4", "5", "6", "7"],
                          "data_source": ["t", "t", "t", "t", "t", None, "t"]})
    holes.write_parquet(tmp_path / "holes.parquet")
    st = BUILD({}, BuildConfig(base=str(tmp_path / "holes.parquet")), tmp_path / "h")
    assert st.rows == 2 and st.base_dropped == {"problem_missing": 2, "label_missing": 1, "domain_unknown": 2}
    shards = pl.read_parquet(tmp_path / "h" / "part-*.parquet")
    assert shards.get_column("problem_id").to_list() == ["a", "f"]
    assert shards.get_column("data_source").to_list() == ["t", "holes"]
    assert any("chem" in w and "None" in w for w in st.warnings)
    assert any("1 base problem(s) have no data_source" in w and "'f'" in w and "'holes'" in w for w in st.warnings)
    # Given as a glob, the set is named after its folder.
    BUILD({}, BuildConfig(base=str(tmp_path / "hol*.parquet")), tmp_path / "g")
    assert pl.read_parquet(tmp_path / "g" / "part-*.parquet").get_column("data_source").to_list() == ["t", tmp_path.name]
    with pytest.raises(DataError, match="--strict"):
        BUILD({}, BuildConfig(base=str(tmp_path / "holes.parquet"), strict=True), tmp_path / "h2")
    # Something else passed as --hints: a schema error naming the file and the missing columns.
    from mentor.data import bundled

    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--hints", str(bundled("gsm8k_rollouts.parquet")), "--out", str(tmp_path / "w")])
    assert r.exit_code == 1 and "gsm8k_rollouts.parquet" in r.output and "not a 'hints' dataset" in r.output and "'hint'" in r.output
    # Hints for problems not in the base set: counted warning, an error with --strict.
    stray = make_hints([{"problem_id": "p-nowhere", "hint": "x"}, {"problem_id": gsm8k_ids(1)[0], "hint": "Look at the eggs."}],
                       tmp_path / "stray" / "hints.parquet")
    st = BUILD({}, BuildConfig(base="gsm8k", hints=[str(stray)]), tmp_path / "s")
    assert st.hints_unmatched == 1 and st.hints_used == 1 and st.hinted_rows == 1
    assert any("p-nowhere" in w for w in st.warnings)
    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--hints", str(stray), "--out", str(tmp_path / "s2"), "--strict"])
    assert r.exit_code == 1 and "p-nowhere" in r.output and "--strict" in r.output
    assert not (tmp_path / "s2" / "manifest.json").exists()


def test_hints_without_ids_are_skipped_and_counted(tmp_path):
    # A hint with a null hint_id would be shown but untraceable (the label carries
    # hint_id); one with a null problem_id cannot be placed. Both are skipped, counted.
    ids = gsm8k_ids(3)
    path = make_hints([{"problem_id": p, "hint": f"Look at {p}."} for p in ids], tmp_path / "h" / "hints.parquet")
    table = pq.read_table(path)
    for col, row in (("hint_id", 0), ("problem_id", 1)):
        values = table.column(col).to_pylist()
        values[row] = None
        table = table.set_column(table.schema.get_field_index(col), pa.field(col, pa.string()), pa.array(values, pa.string()))
    pq.write_table(table, path)
    st = BUILD({}, BuildConfig(base="gsm8k", hints=[str(path)]), tmp_path / "o")
    assert st.hints_missing_ids == 2 and st.hints_used == 1 and st.hints_unmatched == 0 and st.hinted_rows == 1
    assert any("2 hint(s) skipped: null problem_id, hint_id or round" in w and "hints.parquet" in w for w in st.warnings)
    df = read_prompts(tmp_path / "o")
    first = df.filter(pl.col("problem_id") == ids[0]).row(0, named=True)
    assert first["hint_id"] is None and "Hint:" not in first["prompt"][0]["content"]
    assert json.loads((tmp_path / "o" / "stats.json").read_text())["hints_missing_ids"] == 2


def test_empty_hints_and_several_hints_per_problem(tmp_path):
    empty = make_hints([], tmp_path / "empty" / "hints.parquet")
    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--hints", str(empty), "--out", str(tmp_path / "e")])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.output.strip().splitlines()[-1])
    assert stats["rows"] == 1319 and stats["hinted_rows"] == 0 and stats["hints_rows"] == 0
    assert "hints set is empty" in r.output
    pid = gsm8k_ids(1)[0]
    multi = make_hints(
        [{"problem_id": pid, "hint": "old", "hint_id": "h0", "round": 0},
         {"problem_id": pid, "hint": "newer", "hint_id": "h1", "round": 1},
         {"problem_id": pid, "hint": "newer", "hint_id": "h1", "round": 1}],  # listed twice: not a conflict
        tmp_path / "m" / "hints.parquet",
    )
    st = BUILD({}, BuildConfig(base="gsm8k", hints=[str(multi)]), tmp_path / "mo")
    assert st.hints_superseded == 1 and st.hints_duplicate_rows == 1 and st.round == 2
    row = read_prompts(tmp_path / "mo").filter(pl.col("problem_id") == pid).row(0, named=True)
    assert row["hint_id"] == "h1" and "\n\nHint: newer\n\n" in row["prompt"][0]["content"]
    clash = make_hints(
        [{"problem_id": pid, "hint": "a", "hint_id": "ha", "round": 1}, {"problem_id": pid, "hint": "b", "hint_id": "hb", "round": 1}],
        tmp_path / "c" / "hints.parquet",
    )
    with pytest.raises(DataError, match="more than one hint in the same round"):
        BUILD({}, BuildConfig(base="gsm8k", hints=[str(clash)]), tmp_path / "co")
    # Status filter: fallback hints can be left out.
    st = BUILD({}, BuildConfig(base="gsm8k", hints=[str(multi)], hint_statuses=["repaired"]), tmp_path / "f")
    assert st.hinted_rows == 0 and st.hints_skipped_status == 3


def test_a_failed_write_leaves_the_old_build_whole(tmp_path, monkeypatch, gsm8k_hints):
    out = tmp_path / "p"
    BUILD({}, BuildConfig(base="gsm8k", shard_rows=300), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = {"n": 0}
    real = pq.ParquetWriter.write_table

    def flaky(self, table, *args, **kw):
        # The third shard fails after its (temporary) file was opened.
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real(self, table, *args, **kw)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", flaky)
    with pytest.raises(OSError, match="disk full"):
        BUILD({}, BuildConfig(base="gsm8k", hints=[str(gsm8k_hints)], shard_rows=300), out)
    # The old build is there byte for byte; no temporary file or folder is left, inside or beside it.
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_end_to_end_with_fake_hint_stage(tmp_path, gsm8k_collapsed):
    """collapsed (real GSM8K) -> `mentor hint --backend fake` -> `mentor build` -> shards with those hints."""
    hints_dir = tmp_path / "hints"
    r = CliRunner().invoke(cli, ["hint", str(gsm8k_collapsed), "--out", str(hints_dir), "--backend", "fake", "--sample", "12", "--no-progress"])
    if r.exit_code != 0:
        pytest.fail(f"mentor hint --backend fake failed: {r.output}")
    out = tmp_path / "prompts"
    r = CliRunner().invoke(cli, ["build", "--base", "gsm8k", "--hints", str(hints_dir / "hints.parquet"), "--out", str(out), "--mode", "both"])
    assert r.exit_code == 0, r.output
    hints = pl.read_parquet(hints_dir / "hints.parquet")
    df = read_prompts(out)
    hinted = df.filter(pl.col("hint_id").is_not_null())
    assert hinted.height == hints.height == 12 and df.height == 1319 + 12
    joined = hinted.join(hints.select("problem_id", "hint_id", "hint"), on="problem_id")
    for row in joined.iter_rows(named=True):
        assert row["hint_id"] == row["hint_id_right"]
        assert f"\n\nHint: {row['hint']}\n\n" in row["prompt"][0]["content"]


def test_seeded_order_is_plain_splitmix64():
    """The shuffle key is reproducible from its definition alone (no library's RNG stream)."""
    from mentor.stages.build_render import shuffle_key

    m = 1 << 64

    def splitmix(i: int, seed: int) -> int:
        z = ((i + 1) * 0x9E3779B97F4A7C15 + seed) % m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % m
        return z ^ (z >> 31)

    for seed in (0, 7, -3, 2**70):
        got = pl.DataFrame({"x": range(50)}).select(shuffle_key(seed).alias("k"))["k"].to_list()
        assert got == [splitmix(i, seed % m) for i in range(50)]


def test_mixed_domains_get_their_own_instruction_and_label(tmp_path):
    from mentor.data import bundled

    mixed = pl.concat([pl.read_parquet(bundled("gsm8k_problems.parquet")).head(5),
                       pl.read_parquet(bundled("humaneval_problems.parquet")).head(5)])
    mixed.write_parquet(tmp_path / "mixed.parquet")
    pid = mixed["problem_id"][7]
    hints = make_hints([{"problem_id": pid, "hint": "Sort first.", "hint_id": "hc"}], tmp_path / "h.parquet")
    BUILD({}, BuildConfig(base=str(tmp_path / "mixed.parquet"), hints=[str(hints)], round=2), tmp_path / "o")
    df = read_prompts(tmp_path / "o")
    for row, ref in zip(df.iter_rows(named=True), mixed.iter_rows(named=True)):
        dom = ref["domain"]
        user = row["prompt"][0]["content"]
        assert user.endswith("\n\n" + DEFAULT_INSTRUCTIONS[dom]) and row["ability"] == dom
        assert row["label"] == prompt_label(dom, ref["label"], ref["problem_id"], row["hint_id"], 2)
        assert (f"{ref['problem']}\n\nHint: Sort first.\n\n" in user) == (ref["problem_id"] == pid)


def test_rebuild_in_place_is_not_hidden_by_the_datasets_cache(tmp_path):
    """load_dataset(DIR), as OpenRLHF calls it, must see a rebuild's rows, not its cache of the earlier build."""
    datasets = pytest.importorskip("datasets")
    out, cache = tmp_path / "prompts", str(tmp_path / "hf-cache")
    BUILD({}, BuildConfig(base="gsm8k", instructions={"math": "First instruction."}), out)
    first = datasets.load_dataset(str(out), split="train", cache_dir=cache)
    assert first[0]["prompt"][-1]["content"].endswith("First instruction.")
    BUILD({}, BuildConfig(base="gsm8k", instructions={"math": "Second instruction."}), out)
    second = datasets.load_dataset(str(out), split="train", cache_dir=cache)
    assert second[0]["prompt"][-1]["content"].endswith("Second instruction.")


def test_a_base_set_with_long_unused_columns_reads_only_the_problem_columns(tmp_path):
    """DeepMath-103K carries three long R1 solutions a row beside question and final_answer: build reads the
    columns it maps, not the rest (peak memory of a build in its own process, with and without 240 MB unused)."""
    import subprocess
    import sys
    import textwrap

    import pyarrow as pa
    import pyarrow.parquet as pq

    from mentor.data import bundled

    gsm = pl.read_parquet(bundled("gsm8k_problems.parquet")).head(1000)
    import os

    def solutions() -> list[str]:  # 80 KB a row, each different (a repeated value would be read once)
        return [os.urandom(40_000).hex() for _ in range(gsm.height)]

    table = pa.table({"question": gsm["problem"].to_list(), "final_answer": gsm["label"].to_list(),
                      **{f"r1_solution_{i}": solutions() for i in (1, 2, 3)}})
    pq.write_table(table, tmp_path / "deepmath.parquet")
    pq.write_table(table.select(["question", "final_answer"]), tmp_path / "slim.parquet")
    # The process's own peak (VmHWM: ru_maxrss would keep the forking test process's size across the exec).
    code = textwrap.dedent("""
        import sys
        from mentor.stages.build import BUILD, BuildConfig
        BUILD({}, BuildConfig(base=sys.argv[1], mapping={"problem": "question", "label": "final_answer"}), sys.argv[2])
        print(next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")) // 1024)
    """)

    def peak_mib(name: str) -> int:
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / name), str(tmp_path / f"out-{name}")],
                              capture_output=True, text=True, timeout=600, check=True)
        return int(proc.stdout.strip().splitlines()[-1])

    slim, wide = peak_mib("slim.parquet"), peak_mib("deepmath.parquet")
    assert wide < slim + 60, (slim, wide)  # reading the unused columns would add about 240 MB
    assert pl.read_parquet(tmp_path / "out-deepmath.parquet" / "*.parquet").height == 1000
