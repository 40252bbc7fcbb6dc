"""`mentor build` over a corpus of bad inputs built from the real problem sets (bundled, GSM8K and MATH-500 JSONL)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bad_input_lib import Case, invoke, params, run_case
from conftest import SHARED_DATA
from mentor.pipeline.schemas import conform

if not (SHARED_DATA / "gsm8k" / "test.jsonl").exists():  # the cases are built from it at collection time
    pytest.skip(f"real data not found at {SHARED_DATA} (set MENTOR_SHARED_DATA)", allow_module_level=True)


def _gsm8k() -> pl.DataFrame:
    from mentor.data import bundled

    return pl.read_parquet(bundled("gsm8k_problems.parquet"))


def hints_file(path: Path, rows: list[dict]) -> Path:
    """A HINTS dataset: a few fields per row, the rest as the hint stage fills them."""
    full = [{"problem_id": r["problem_id"], "round": r.get("round", 0), "hint_id": r.get("hint_id", f"h-{i}"),
             "hint": r.get("hint", "Track each quantity separately."), "keywords": [], "error": None,
             "status": r.get("status", "accepted"), "retries": 0, "refines": 0, "judge_score": 8.0, "violations": [],
             "trace": [], "model": "test", "prompt_version": "v", "config_hash": "c"} for i, r in enumerate(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(full, schema=pa.schema([f.with_nullable(True) for f in conform(pa.table({}), "hints").schema]))
    pq.write_table(table, path)
    return path


def _build(root: Path, *extra: str, base: str = "gsm8k") -> list[str]:
    return ["build", "--base", base, "--out", str(root / "out"), *extra]


def _base_file(root: Path, frame: pl.DataFrame, name: str = "base.parquet") -> str:
    path = root / name
    if name.endswith(".parquet"):
        frame.write_parquet(path)
    else:
        frame.write_ndjson(path)
    return str(path)


def make_cases() -> list[Case]:
    g = _gsm8k()
    ids = g["problem_id"].to_list()
    test_jsonl = SHARED_DATA / "gsm8k" / "test.jsonl"
    math_jsonl = SHARED_DATA / "math500" / "test.jsonl"
    cases: list[Case] = []
    add = cases.append

    # ---------------------------------------------------------------- counted (exit 0)
    def holes(r: Path) -> list[str]:
        f = g.head(10).with_columns(
            problem=pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise("problem"),
            label=pl.when(pl.int_range(pl.len()) == 1).then(None).otherwise("label"),
            domain=pl.when(pl.int_range(pl.len()) == 2).then(pl.lit("chem")).otherwise("domain"),
        )
        return _build(r, base=_base_file(r, f))

    add(Case("base-rows-unusable", "quarantine", holes, 0,
             stats={"rows": 7, "base_dropped": {"domain_unknown": 1, "label_missing": 1, "problem_missing": 1}}))

    def blank(r: Path) -> list[str]:
        f = g.head(5).with_columns(problem=pl.when(pl.int_range(pl.len()) == 0).then(pl.lit(" \u3000\n")).otherwise("problem"))
        return _build(r, base=_base_file(r, f))

    add(Case("base-blank-problem", "quarantine", blank, 0, stats={"rows": 4, "base_dropped": {"problem_missing": 1}}))

    def stray_hints(r: Path) -> list[str]:
        h = hints_file(r / "h" / "hints.parquet", [{"problem_id": "p-nowhere"}, {"problem_id": ids[0]}])
        return _build(r, "--hints", str(h))

    add(Case("hints-unmatched", "quarantine", stray_hints, 0, stats={"hints_unmatched": 1, "hints_used": 1}))

    def null_id_hints(r: Path) -> list[str]:
        h = hints_file(r / "h" / "hints.parquet", [{"problem_id": None}, {"problem_id": ids[1], "hint_id": None}, {"problem_id": ids[2]}])
        return _build(r, "--hints", str(h))

    add(Case("hints-null-ids", "quarantine", null_id_hints, 0, stats={"hints_missing_ids": 2, "hints_used": 1}))

    def empty_hint(r: Path) -> list[str]:
        h = hints_file(r / "h" / "hints.parquet", [{"problem_id": ids[0], "hint": "  "}, {"problem_id": ids[1]}])
        return _build(r, "--hints", str(h))

    add(Case("hints-empty-text", "quarantine", empty_hint, 0, stats={"hints_empty_text": 1, "hints_used": 1}))

    def bom_jsonl(r: Path) -> list[str]:
        p = r / "test.jsonl"
        p.write_bytes(b"\xef\xbb\xbf" + test_jsonl.read_bytes())
        return _build(r, "--map", "problem=question", "--map", "label=answer", "--answer-after", "####", base=str(p))

    def same_ids_as_bundled(r: Path, res) -> None:
        got = pl.read_parquet(r / "out" / "part-*.parquet")
        assert got.height == 1319 and set(got["problem_id"]) == set(ids)

    add(Case("base-jsonl-with-bom", "handled", bom_jsonl, 0, stats={"rows": 1319}, check=same_ids_as_bundled))

    def rebuild_fewer_shards(r: Path) -> list[str]:
        return _build(r, "--shard-rows", "100000")

    def one_shard(r: Path, res) -> None:
        assert sorted(p.name for p in (r / "out").glob("part-*.parquet")) == ["part-00000.parquet"]
        manifest = json.loads((r / "out" / "manifest.json").read_text())
        assert manifest["rows"] == 1319 and len(manifest["shards"]) == 1
        assert (r / "out" / "notes.txt").read_text() == "mine"  # not ours: carried into the new build

    def with_notes(out: Path) -> None:
        shutil.copytree(OLD["build"], out)
        (out / "notes.txt").write_text("mine")

    add(Case("rebuild-in-place-fewer-shards", "handled", rebuild_fewer_shards, 0, stats={"shards": 1}, check=one_shard))
    PREPARE["rebuild-in-place-fewer-shards"] = with_notes

    def stale_temps(r: Path) -> list[str]:
        # What killed runs of older versions and of this one left: temporary files inside the
        # folder, and a staged folder beside it (its process, pid 999999999, is long gone).
        out = r / "out"
        shutil.copytree(OLD["build"], out)
        for i in range(7):
            (out / f".part-0000{i}.parquet.k{i}x.tmp").write_bytes(b"half")
        (r / ".out.build-999999999-abc123.tmp").mkdir()
        (r / ".out.build-999999999-abc123.tmp" / "part-00000.parquet").write_bytes(b"half")
        return _build(r)

    add(Case("stale-temp-files-cleaned", "handled", stale_temps, 0, stats={"rows": 1319}))

    # ---------------------------------------------------------------- clear errors
    add(Case("base-missing-file", "error", lambda r: _build(r, base=str(r / "nope.parquet")), 2, r"nope\.parquet: no such file"))
    add(Case("base-unknown-name", "error", lambda r: _build(r, base="gsm9k"), 2, r"--base gsm9k: no such file, and not a bundled set"))
    add(Case("base-duplicate-ids", "error", lambda r: _build(r, base=_base_file(r, pl.concat([g.head(5), g.head(2)]))), 1,
             r"base\.parquet: 2 duplicate problem_id\(s\) in the base set"))
    add(Case("base-wrong-columns", "error",
             lambda r: _build(r, base=_base_file(r, g.rename({"problem": "question", "label": "answer"}).drop("problem_id"))), 1,
             r"not a problem set: column\(s\) 'problem', 'label' missing .*--map problem=question --map label=answer"))
    add(Case("base-no-rows", "error", lambda r: _build(r, base=_base_file(r, g.head(0))), 1, r"the base problem set has no rows"))

    def raw_jsonl(r: Path, data: bytes, *extra: str) -> list[str]:
        (r / "b.jsonl").write_bytes(data)
        return _build(r, *extra, base=str(r / "b.jsonl"))

    lines = test_jsonl.read_bytes().splitlines(keepends=True)
    add(Case("base-jsonl-latin1", "error", lambda r: raw_jsonl(r, b"".join(lines[:3]) + b'{"question": "caf\xe9"}\n'), 1,
             r"b\.jsonl:4: not UTF-8"))
    add(Case("base-jsonl-deep", "error",
             lambda r: raw_jsonl(r, b"".join(lines[:3]) + b'{"question": ' + b"[" * 5000 + b"]" * 5000 + b"}\n"), 1,
             r"b\.jsonl:4: JSON nested too deeply"))
    add(Case("base-jsonl-torn", "error", lambda r: raw_jsonl(r, b"".join(lines[:3]) + b'{"question": "a'), 1,
             r"b\.jsonl:4: not valid JSON"))
    add(Case("base-jsonl-empty", "error", lambda r: raw_jsonl(r, b""), 1, r"b\.jsonl: the file is empty"))

    def math500_map_missing(r: Path) -> list[str]:
        return _build(r, "--map", "problem=question", base=str(math_jsonl))

    add(Case("base-map-column-missing", "error", math500_map_missing, 1, r"--map problem=question: column 'question' not found"))
    add(Case("map-unknown-canonical", "error", lambda r: _build(r, "--map", "answer=label"), 2, r"--map answer=\.\.\.: not a problem column"))

    def wrong_hints(r: Path) -> list[str]:
        from mentor.data import bundled

        return _build(r, "--hints", str(bundled("gsm8k_rollouts.parquet")))

    add(Case("hints-wrong-schema", "error", wrong_hints, 1, r"gsm8k_rollouts\.parquet: not a 'hints' dataset"))

    def clash(r: Path) -> list[str]:
        h = hints_file(r / "h" / "hints.parquet", [{"problem_id": ids[0], "hint_id": "a"}, {"problem_id": ids[0], "hint_id": "b"}])
        return _build(r, "--hints", str(h))

    add(Case("hints-two-per-round", "error", clash, 1, r"more than one hint in the same round"))

    def strict_unmatched(r: Path) -> list[str]:
        h = hints_file(r / "h" / "hints.parquet", [{"problem_id": "p-nowhere"}])
        return _build(r, "--hints", str(h), "--strict")

    add(Case("strict-unmatched", "error", strict_unmatched, 1, r"p-nowhere.*--strict"))
    add(Case("hints-missing", "error", lambda r: _build(r, "--hints", str(r / "nope.parquet")), 2, r"nope\.parquet: no such file"))
    for opt, v in [("--shard-rows", "0"), ("--shard-rows", "-3"), ("--shard-bytes", "10"), ("--round", "-1"), ("--round", str(2**40)),
                   ("--shard-rows", str(2**70)), ("--shard-bytes", str(2**70)), ("--shard-rows", "1.5")]:
        add(Case(f"option{opt}={v}", "error", lambda r, o=opt, v=v: _build(r, o, v), 2, opt))
    add(Case("shard-rows-and-bytes", "error", lambda r: _build(r, "--shard-rows", "10", "--shard-bytes", "2048"), 2,
             r"--shard-rows or --shard-bytes"))

    def template(r: Path, text: bytes, opt: str = "--template") -> list[str]:
        (r / "t.txt").write_bytes(text)
        return _build(r, opt, str(r / "t.txt"))

    add(Case("template-without-hint", "error", lambda r: template(r, b"{problem}"), 2, r"template lacks the placeholder\(s\) \{hint\}"))
    add(Case("plain-template-with-hint", "error", lambda r: template(r, b"{hint} {problem}", "--plain-template"), 2,
             r"plain_template must not use \{hint\}"))
    add(Case("template-not-utf8", "error", lambda r: template(r, b"Hint: {hint}\xff {problem}"), 2, r"--template .*UTF-8"))
    add(Case("system-twice", "error", lambda r: (r / "s.txt").write_text("x") and _build(r, "--system", "y", "--system-file", str(r / "s.txt")),
             2, r"--system or --system-file"))
    add(Case("instruction-without-equals", "error", lambda r: _build(r, "--instruction", "math"), 2, r"--instruction"))
    add(Case("instruction-unknown-domain", "error", lambda r: _build(r, "--instruction", "chem=x"), 2, r"unknown domain"))
    add(Case("hf-spec-malformed", "error", lambda r: _build(r, base="hf:a:b:c:d"), 2, r"hf:NAME:SPLIT"))

    def bad_code_label(r: Path) -> list[str]:
        f = g.head(3).with_columns(domain=pl.lit("code"), label=pl.lit("not json"))
        return _build(r, base=_base_file(r, f))

    add(Case("code-label-not-json", "error", bad_code_label, 1, r"label is not a code label JSON"))

    def out_file(r: Path) -> list[str]:
        (r / "o").write_text("x")
        return ["build", "--base", "gsm8k", "--out", str(r / "o")]

    add(Case("out-is-a-file", "error", out_file, 2, r"--out"))
    return cases


PREPARE: dict[str, object] = {}
OLD: dict[str, Path] = {}
CASES = make_cases()


@pytest.fixture(scope="module")
def old_build(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("old")
    res = invoke(["build", "--base", "gsm8k", "--out", str(d / "out"), "--shard-rows", "300", "--seed", "3"])
    assert res.exit_code == 0, res.output
    OLD["build"] = d / "out"
    return d / "out"


@pytest.mark.parametrize("case", params(CASES))
def test_build_bad_input(case: Case, tmp_path, old_build):
    prepare = PREPARE.get(case.id) or (lambda out: shutil.copytree(old_build, out))
    run_case(case, tmp_path / "case", prepare_out=prepare)
