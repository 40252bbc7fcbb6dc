"""`mentor ingest` over a corpus of bad inputs built from the real GSM8K rollouts.

Each case: exit code, first line of the message, quarantine counters, and (on an
error) the output folder left exactly as it was. See bad_input_lib.py.
Over 500 lines because the corpus of cases is data: one table of bad inputs per format.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bad_input_lib import Case, invoke, params, run_case, write_jsonl
from mentor.pipeline.ids import text_id
from mentor.stages.build import DEFAULT_INSTRUCTIONS
from mentor.stages.ingest_formats import GSM8K_MODELS

MATH = DEFAULT_INSTRUCTIONS["math"]


def chatml(user: str) -> str:
    """The prompt as OpenRLHF sends it with a ChatML template (Qwen, SmolLM2)."""
    return f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def real(gsm8k_example) -> list[dict]:
    """The first 6 real GSM8K problems with their four real rollouts."""
    with open(gsm8k_example, encoding="utf-8") as fh:
        return [json.loads(next(fh)) for _ in range(6)]


def records(real: list[dict], hinted: bool = True, **override) -> list[dict]:
    """Our reward file's JSONL records for the real rollouts: chat-templated prompt (mentor's Hint: block), round 2."""
    out = []
    for i, rec in enumerate(real):
        hint = "Count what is left before multiplying." if hinted and i % 2 == 0 else None
        user = (f"Hint: {hint}\n\n" if hint else "") + rec["question"] + "\n\n" + MATH
        for seq, model in enumerate(GSM8K_MODELS):
            r = {"v": 1, "problem_id": text_id(rec["question"]), "round": 2, "domain": "math", "prompt": chatml(user),
                 "response": rec[model]["solution"], "correct": float(rec[model]["is_correct"]), "reward": 0.0,
                 "hint_id": f"h-{i}" if hint else None, "label": rec["ground_truth"].rsplit("A:", 1)[-1].strip(),
                 "pid": 7, "seq": i * 4 + seq}
            out.append(r)
    for k, v in override.items():
        out[0][k] = v
    return out


def mapped(real: list[dict]) -> list[dict]:
    """A generic JSONL log (--format jsonl) of the real rollouts with explicit ids and sample indices."""
    return [{"problem_id": f"q{i}", "problem": rec["question"], "sample_idx": j, "response": rec[m]["solution"],
             "correct": rec[m]["is_correct"], "label": "x"}
            for i, rec in enumerate(real) for j, m in enumerate(GSM8K_MODELS)]


def _ingest(*sources: str, out: str = "out", extra: tuple[str, ...] = ()) -> list[str]:
    return ["ingest", *sources, "--out", out, *extra]


def case_openrlhf(real, cid, kind, patch, exit=0, message=None, quarantined=None, stats=None, hinted=True):
    def make(root: Path) -> list[str]:
        rows = records(real, hinted)
        rows = patch(rows) or rows
        write_jsonl(root / "logs" / "r.jsonl", rows)
        return _ingest(str(root / "logs"), out=str(root / "out"), extra=("--format", "openrlhf"))

    return Case(cid, kind, make, exit, message, quarantined or {}, stats or {})


def set0(key, value):
    def patch(rows):
        rows[0][key] = value
    return patch


def setrow(i, **kv):
    def patch(rows):
        rows[i].update(kv)
    return patch


def make_cases(real: list[dict], bundled_rollouts: Path) -> list[Case]:
    n = 24  # rollouts in `records`
    cases: list[Case] = []
    add = cases.append

    # ---------------------------------------------------------------- quarantined by reason (exit 0)
    for cid, value, reason in [
        ("pid-null", None, "problem_id_missing"), ("pid-empty", "", "problem_id_missing"), ("pid-blank", "  ", "problem_id_missing"),
        ("pid-list", ["a"], "problem_id_invalid"), ("pid-float", 1.5, "problem_id_invalid"), ("pid-bool", True, "problem_id_invalid"),
        ("pid-dict", {"id": 1}, "problem_id_invalid"),
        ("round-string", "0", "round_invalid"), ("round-fraction", 0.9, "round_invalid"), ("round-2^40", 2**40, "round_invalid"),
        ("round-1e10", 1e10, "round_invalid"), ("round-bool", True, "round_invalid"), ("round-negative", -1, "round_invalid"),
        ("round-null", None, "round_invalid"), ("round-nan", float("nan"), "round_invalid"),
    ]:
        add(case_openrlhf(real, f"openrlhf-{cid}", "quarantine", set0("problem_id" if cid.startswith("pid") else "round", value),
                          quarantined={reason: 1}, stats={"rollouts": n - 1}))
    # Two records with null ids are not merged into one problem "None" (that hid a collapse).
    add(case_openrlhf(real, "openrlhf-pid-null-twice", "quarantine",
                      lambda rows: [rows[0].update(problem_id=None), rows[5].update(problem_id=None)] and None,
                      quarantined={"problem_id_missing": 2}, stats={"rollouts": n - 2, "problems": 6}))
    add(case_openrlhf(real, "openrlhf-round-integral-float", "handled", set0("round", 2.0), stats={"rollouts": n}))
    add(case_openrlhf(real, "openrlhf-missing-fields", "quarantine", lambda rows: rows[0].pop("correct") and None,
                      quarantined={"record_missing_fields": 1}))
    for cid, value, reason in [("correct-null", None, "correct_missing"), ("correct-text", "yes", "correct_missing"),
                               ("correct-nan", float("nan"), "correct_missing"), ("correct-1.5", 1.5, "correct_out_of_range"),
                               ("correct-negative", -1, "correct_out_of_range"), ("correct-inf", float("inf"), "correct_out_of_range"),
                               ("correct-10^400", 10**400, "correct_out_of_range")]:
        add(case_openrlhf(real, f"openrlhf-{cid}", "quarantine", set0("correct", value), quarantined={reason: 1}))
    add(case_openrlhf(real, "openrlhf-reward-10^400", "handled", set0("reward", -(10**400)), stats={"rollouts": n}))
    add(case_openrlhf(real, "openrlhf-response-null", "quarantine", set0("response", None), quarantined={"response_missing": 1}))
    add(case_openrlhf(real, "openrlhf-domain-unknown", "quarantine", set0("domain", "physics"), quarantined={"domain_unknown": 1}))
    add(case_openrlhf(real, "openrlhf-domain-number", "quarantine", set0("domain", 5), quarantined={"domain_unknown": 1}))
    add(case_openrlhf(real, "openrlhf-prompt-null", "quarantine", set0("prompt", None), quarantined={"prompt_missing": 1}))
    add(case_openrlhf(real, "openrlhf-prompt-messages", "handled",
                      set0("prompt", [{"role": "user", "content": real[0]["question"]}]), stats={"rollouts": n}))
    add(case_openrlhf(real, "openrlhf-step-2^70", "handled", set0("step", 2**70), stats={"rollouts": n}))
    add(case_openrlhf(real, "openrlhf-seq-text", "handled", set0("seq", "x"), stats={"rollouts": n}))
    add(case_openrlhf(real, "openrlhf-truncated-text", "handled", set0("truncated", "yes"), stats={"rollouts": n}))
    add(case_openrlhf(real, "openrlhf-trainer-number", "handled", set0("trainer", 3), stats={"rollouts": n}))
    add(case_openrlhf(real, "openrlhf-label-nested", "handled", set0("label", {"answer": [1, {"a": 2}]}), stats={"rollouts": n}))
    add(case_openrlhf(real, "openrlhf-not-an-object-line", "quarantine", lambda rows: rows.insert(3, "42") or None,
                      quarantined={"bad_json_line": 1}, stats={"rollouts": n}))
    add(case_openrlhf(real, "openrlhf-array-line", "quarantine", lambda rows: rows.insert(3, "[1, 2]") or None,
                      quarantined={"bad_json_line": 1}, stats={"rollouts": n}))

    def torn(root: Path) -> list[str]:
        write_jsonl(root / "logs" / "r.jsonl", records(real), raw_tail='{"v": 1, "problem_id": "p-')
        return _ingest(str(root / "logs"), out=str(root / "out"), extra=("--format", "openrlhf"))

    add(Case("openrlhf-torn-last-line", "quarantine", torn, 0, quarantined={"bad_json_line": 1}, stats={"rollouts": n}))

    def two_processes(root: Path) -> list[str]:
        # Each trainer process writes its own file; a problem's samples are spread over both.
        rows = records(real)
        for k, r in enumerate(rows):
            r["pid"] = 100 + k % 2
        write_jsonl(root / "logs" / "openrlhf-a.jsonl", rows[0::2])
        write_jsonl(root / "logs" / "openrlhf-b.jsonl", rows[1::2])
        return _ingest(str(root / "logs"), out=str(root / "out"), extra=("--format", "openrlhf"))

    add(Case("openrlhf-problem-spread-over-process-files", "handled", two_processes, 0,
             stats={"rollouts": n, "problems": 6, "quarantined_total": 0}))

    def bom(root: Path) -> list[str]:
        p = write_jsonl(root / "logs" / "r.jsonl", records(real))
        p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
        return _ingest(str(p), out=str(root / "out"), extra=("--format", "auto"))

    add(Case("bom-first-record-kept", "handled", bom, 0, stats={"rollouts": n, "quarantined_total": 0}))

    def blank_lines(root: Path) -> list[str]:
        rows = records(real)
        rows.insert(2, "")
        rows.insert(5, "   ")
        write_jsonl(root / "r.jsonl", rows)
        return _ingest(str(root / "r.jsonl"), out=str(root / "out"), extra=("--format", "openrlhf"))

    add(Case("blank-lines-skipped", "handled", blank_lines, 0, stats={"rollouts": n, "quarantined_total": 0}))

    def gz(root: Path) -> list[str]:
        (root / "logs").mkdir()
        with gzip.open(root / "logs" / "r.jsonl.gz", "wt", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records(real))
        return _ingest(str(root / "logs"), out=str(root / "out"), extra=("--format", "openrlhf"))

    add(Case("gzip-log", "handled", gz, 0, stats={"rollouts": n}))

    # Original problem text without --problems.
    def recovered(root: Path, res) -> None:
        df = pl.read_parquet(root / "out" / "*.parquet")
        want = {text_id(r["question"]): r["question"] for r in real}
        assert all(row["problem"] == want[row["problem_id"]] for row in df.iter_rows(named=True))

    c = case_openrlhf(real, "openrlhf-no-problems-recovered", "handled", lambda rows: None, stats={"problem_missing": 0})
    c.check = recovered
    add(c)

    def custom_template(rows):
        for r in rows:
            if r["hint_id"]:
                r["prompt"] = chatml(f"Consider this: think before you count.\n{real[0]['question']} (reason step by step)")
                r["problem_id"] = "q-custom"

    def missing_counted(root: Path, res) -> None:
        assert "no original problem text" in res.output and "--problems" in res.output
        df = pl.read_parquet(root / "out" / "*.parquet")
        assert df.filter(pl.col("problem_id") == "q-custom")["problem"].null_count() == 12

    c = case_openrlhf(real, "openrlhf-custom-template-problem-missing", "quarantine", custom_template, stats={"problem_missing": 12})
    c.check = missing_counted
    add(c)

    def with_bundled(root: Path) -> list[str]:
        write_jsonl(root / "logs" / "r.jsonl", records(real))
        return _ingest(str(root / "logs"), out=str(root / "out"), extra=("--format", "openrlhf", "--problems", "gsm8k"))

    c = Case("problems-bundled-name", "handled", with_bundled, 0, stats={"problem_missing": 0})
    c.check = recovered
    add(c)

    # Generic JSONL: sample_idx / round never truncated, ids never derived when the id column is null.
    def jsonl_case(cid, kind, patch, exit=0, message=None, quarantined=None, stats=None, extra=()):
        def make(root: Path) -> list[str]:
            rows = mapped(real)
            patch(rows)
            write_jsonl(root / "log.jsonl", rows)
            return _ingest(str(root / "log.jsonl"), out=str(root / "out"), extra=("--format", "jsonl", *extra))

        return Case(cid, kind, make, exit, message, quarantined or {}, stats or {})

    add(jsonl_case("jsonl-sample-idx-fractions", "quarantine",
                   lambda rows: (rows[0].update(sample_idx=0.9), rows[1].update(sample_idx=0.2)),
                   quarantined={"sample_idx_invalid": 2, "duplicate_key": 0}, stats={"rollouts": 22}))
    for cid, v in [("text", "zero"), ("string-digit", "0"), ("2^40", 2**40), ("1e10", 1e10), ("negative", -1), ("bool", False),
                   ("list", [0])]:
        add(jsonl_case(f"jsonl-sample-idx-{cid}", "quarantine", setrow(0, sample_idx=v), quarantined={"sample_idx_invalid": 1}))
    add(jsonl_case("jsonl-round-2^40", "quarantine", setrow(0, round=2**40), quarantined={"round_invalid": 1}))
    add(jsonl_case("jsonl-round-string", "quarantine", setrow(0, round="1"), quarantined={"round_invalid": 1}))
    add(jsonl_case("jsonl-pid-null", "quarantine", setrow(0, problem_id=None), quarantined={"problem_id_missing": 1}))
    add(jsonl_case("jsonl-no-text", "quarantine", setrow(0, problem=None), quarantined={"prompt_missing": 1}))
    add(jsonl_case("jsonl-no-id-no-text", "quarantine", lambda rows: [r.pop("problem_id") for r in rows] and rows[0].update(problem=None),
                   quarantined={"prompt_missing": 1}))
    add(jsonl_case("jsonl-duplicate", "quarantine", setrow(1, sample_idx=0), quarantined={"duplicate_key": 1}))
    add(jsonl_case("jsonl-step-huge", "handled", setrow(0, step=10**30), stats={"rollouts": 24}))
    add(jsonl_case("jsonl-lone-surrogate", "handled", setrow(0, response="cut \ud800 here", problem_id="q\udfff0"),
                   stats={"rollouts": 24, "text_repaired": 1, "quarantined_total": 0}))
    add(jsonl_case("jsonl-correct-as-text-bool", "handled", lambda rows: [r.update(correct=str(r["correct"]).lower()) for r in rows],
                   stats={"rollouts": 24, "quarantined_total": 0}))
    add(jsonl_case("jsonl-response-number", "handled", setrow(0, response=12), stats={"rollouts": 24}))

    def clip(rows):
        rows[0]["response"] = "x" * 5000 + " A: 18"

    c = jsonl_case("jsonl-oversized-response-clipped", "handled", clip, stats={"response_clipped": 1, "rollouts": 24},
                   extra=("--max-response-bytes", "1000"))
    add(c)

    def verl(root: Path, step) -> list[str]:
        rows = [{"input": r["question"], "output": r[m]["solution"], "score": float(r[m]["is_correct"]), "step": step}
                for r in real for m in GSM8K_MODELS]
        write_jsonl(root / "dump" / "3.jsonl", rows)
        return _ingest(str(root / "dump"), out=str(root / "out"))

    add(Case("verl-step-2^70", "handled", lambda root: verl(root, 2**70), 0, stats={"rollouts": 24, "problem_missing": 0}))

    def verl_input_missing(root: Path) -> list[str]:
        rows = [{"input": None, "output": "x", "score": 1.0}]
        write_jsonl(root / "dump" / "3.jsonl", rows)
        return _ingest(str(root / "dump"), out=str(root / "out"), extra=("--format", "verl"))

    add(Case("verl-input-not-text", "error", verl_input_missing, 1, r"3\.jsonl:1: column 'input' or 'output' missing or not text"))

    def gsm8k_sample_missing(root: Path) -> list[str]:
        rows = [dict(r) for r in real]
        rows[0].pop("6b_verification")
        write_jsonl(root / "ex.jsonl", rows)
        return _ingest(str(root / "ex.jsonl"), out=str(root / "out"))

    add(Case("gsm8k-sample-missing", "quarantine", gsm8k_sample_missing, 0, quarantined={"sample_missing": 1}))

    def gsm8k_question_null(root: Path) -> list[str]:
        rows = [dict(r) for r in real]
        rows[2]["question"] = None
        write_jsonl(root / "ex.jsonl", rows)
        return _ingest(str(root / "ex.jsonl"), out=str(root / "out"), extra=("--format", "gsm8k-example"))

    add(Case("gsm8k-question-null", "error", gsm8k_question_null, 1, r"ex\.jsonl:3: column 'question' or 'ground_truth'"))

    # Canonical Parquet written by another tool.
    def canonical(root: Path, change) -> list[str]:
        t = pl.read_parquet(bundled_rollouts).head(40)
        t = change(t)
        t.write_parquet(root / "c.parquet")
        return _ingest(str(root / "c.parquet"), out=str(root / "out"), extra=("--format", "canonical"))

    add(Case("canonical-round-2^40", "quarantine", lambda r: canonical(r, lambda t: t.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(2**40).otherwise(pl.col("round").cast(pl.Int64)).alias("round"))), 0,
        quarantined={"round_invalid": 1}, stats={"rollouts": 39}))
    add(Case("canonical-sample-idx-negative", "quarantine", lambda r: canonical(r, lambda t: t.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(-1).otherwise(pl.col("sample_idx")).alias("sample_idx"))), 0,
        quarantined={"sample_idx_invalid": 1}))
    add(Case("canonical-pid-null", "quarantine", lambda r: canonical(r, lambda t: t.with_columns(
        pl.when(pl.int_range(pl.len()) < 3).then(None).otherwise(pl.col("problem_id")).alias("problem_id"))), 0,
        quarantined={"problem_id_missing": 3}, stats={"rollouts": 37}))
    add(Case("canonical-no-text", "quarantine", lambda r: canonical(r, lambda t: t.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("zz")).otherwise(pl.col("problem_id")).alias("problem_id"),
        pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("prompt")).alias("prompt"),
        pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("problem")).alias("problem"))), 0,
        quarantined={"prompt_missing": 1}))

    # ---------------------------------------------------------------- clear errors (exit 1 data, 2 usage)
    def src(root: Path, name: str, data: bytes | str, *extra: str) -> list[str]:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return _ingest(str(p), out=str(root / "out"), extra=extra)

    good = "".join(json.dumps(r) + "\n" for r in records(real)).encode()
    add(Case("missing-file", "error", lambda r: _ingest(str(r / "nope.jsonl"), out=str(r / "out")), 2, r"nope\.jsonl: no such file"))
    add(Case("empty-file", "error", lambda r: src(r, "e.jsonl", b"", "--format", "openrlhf"), 1, r"e\.jsonl: the file is empty"))
    add(Case("empty-folder", "error", lambda r: (r / "d").mkdir() or _ingest(str(r / "d"), out=str(r / "out")), 2,
             r"d: the directory holds no"))
    add(Case("glob-matches-nothing", "error", lambda r: _ingest(str(r / "*.jsonl"), out=str(r / "out")), 2, r"matches no file"))
    add(Case("latin1-bytes", "error", lambda r: src(r, "l.jsonl", good + b'{"x": "caf\xe9"}\n', "--format", "openrlhf"), 1,
             r"l\.jsonl:25: not UTF-8 \(byte 0xe9 at column \d+\); re-encode"))
    add(Case("utf16-file", "error", lambda r: src(r, "u.jsonl", good.decode().encode("utf-16"), "--format", "openrlhf"), 1,
             r"u\.jsonl:1: not UTF-8"))
    add(Case("json-array-not-lines", "error", lambda r: src(r, "a.json", json.dumps(records(real), indent=1), "--format", "openrlhf"),
             1, r"a\.json:1: a JSON array, not JSON Lines"))
    deep = good + ('{"v": ' + "[" * 100000 + "]" * 100000 + "}\n").encode()
    add(Case("deep-json-nesting", "error", lambda r: src(r, "deep.jsonl", deep, "--format", "openrlhf"), 1,
             r"deep\.jsonl:25: JSON nested too deeply"))
    add(Case("corrupt-parquet", "error", lambda r: src(r, "c.parquet", bundled_rollouts.read_bytes()[:3000], "--format", "canonical"),
             1, r"c\.parquet: not a readable Parquet file"))

    def wrong_type(root: Path) -> list[str]:
        t = pq.read_table(bundled_rollouts)
        t = t.set_column(t.schema.get_field_index("correct"), "correct", pa.array(["yes"] * t.num_rows))
        pq.write_table(t, root / "t.parquet")
        return _ingest(str(root / "t.parquet"), out=str(root / "out"), extra=("--format", "canonical"))

    add(Case("canonical-wrong-type", "error", wrong_type, 1, r"t\.parquet: not canonical rollouts: column 'correct' has type string"))

    def missing_col(root: Path) -> list[str]:
        pq.write_table(pq.read_table(bundled_rollouts).drop(["response"]), root / "t.parquet")
        return _ingest(str(root / "t.parquet"), out=str(root / "out"), extra=("--format", "canonical"))

    add(Case("canonical-missing-column", "error", missing_col, 1, r"column 'response' missing"))
    def verl_parquet(root: Path, *extra: str) -> list[str]:
        rows = [{"input": r["question"], "output": r[m]["solution"], "score": float(r[m]["is_correct"])} for r in real for m in GSM8K_MODELS]
        pl.DataFrame(rows).write_parquet(root / "dump.parquet")
        return _ingest(str(root / "dump.parquet"), out=str(root / "out"), extra=extra)

    add(Case("parquet-of-another-layout", "error", verl_parquet, 1, r"dump\.parquet: column 'response', 'correct'.*--map response="))
    add(Case("parquet-given-as-verl", "error", lambda r: verl_parquet(r, "--format", "verl"), 1,
             r"dump\.parquet: a Parquet file, but --format verl logs are JSONL"))
    add(Case("parquet-mapped", "handled",
             lambda r: verl_parquet(r, "--map", "prompt=input", "--map", "response=output", "--map", "correct=score"), 0,
             stats={"rollouts": n, "problems": 6, "problem_missing": 0}))
    add(Case("unknown-layout", "error", lambda r: src(r, "x.jsonl", '{"foo": 1}\n'), 2, r"--format jsonl with --map"))
    add(Case("jsonl-missing-mapped-column", "error",
             lambda r: src(r, "x.jsonl", '{"problem_id": "a", "response": "r", "ok": 1}\n', "--format", "jsonl"), 1,
             r"x\.jsonl: column 'correct' missing .*; pass --map correct="))
    add(Case("map-unknown-column-typo", "error",
             lambda r: src(r, "x.jsonl", good, "--format", "jsonl", "--map", "problem_idd=problem_id"), 2,
             r"--map problem_idd=problem_id: 'problem_idd' is not a rollout column"))
    add(Case("map-to-absent-column", "error",
             lambda r: src(r, "x.jsonl", good, "--format", "jsonl", "--map", "problem_id=qid"), 1,
             r"x\.jsonl: column 'qid' \(--map problem_id=qid\) missing"))
    add(Case("not-a-regular-file", "error", lambda r: _ingest("/dev/zero", out=str(r / "out")), 2, r"/dev/zero: not a regular file"))
    add(Case("map-without-equals", "error", lambda r: src(r, "x.jsonl", good, "--format", "jsonl", "--map", "correct"), 2,
             r"--map"))
    for v in ("0", "-5", "x"):
        add(Case(f"max-response-bytes-{v}", "error", lambda r, v=v: src(r, "x.jsonl", good, "--max-response-bytes", v), 2,
                 r"--max-response-bytes"))
    for v in ("-1", str(2**40)):
        add(Case(f"round-option-{v}", "error", lambda r, v=v: src(r, "x.jsonl", good, "--round", v), 2, r"--round"))
    add(Case("format-unknown", "error", lambda r: src(r, "x.jsonl", good, "--format", "csv"), 2, r"--format"))
    add(Case("problems-not-found", "error", lambda r: src(r, "x.jsonl", good, "--format", "openrlhf", "--problems", "gsm9k"), 2,
             r"--problems gsm9k: no such file, and not a bundled set \(gsm8k, math500, humaneval\)"))
    add(Case("problems-not-a-problem-set", "error",
             lambda r: src(r, "x.jsonl", good, "--format", "openrlhf", "--problems", str(bundled_rollouts)), 1,
             r"not a 'problems' dataset"))

    def all_bad(root: Path) -> list[str]:
        rows = records(real)
        for r in rows:
            r["correct"] = None
        write_jsonl(root / "x.jsonl", rows)
        return _ingest(str(root / "x.jsonl"), out=str(root / "out"), extra=("--format", "openrlhf"))

    add(Case("every-row-quarantined", "error", all_bad, 1, r"no usable rollouts in .*correct_missing"))

    # All or nothing: one bad file of several leaves the output folder as it was.
    def one_bad_of_two(root: Path, bad: bytes) -> list[str]:
        (root / "logs").mkdir()
        (root / "logs" / "a.jsonl").write_bytes(good)
        (root / "logs" / "b.jsonl").write_bytes(bad)
        return _ingest(str(root / "logs"), out=str(root / "out"), extra=("--format", "openrlhf"))

    add(Case("second-file-not-utf8", "error", lambda r: one_bad_of_two(r, b'{"x": "\xff"}\n'), 1, r"b\.jsonl:1: not UTF-8"))
    add(Case("second-file-empty", "error", lambda r: one_bad_of_two(r, b""), 1, r"b\.jsonl: the file is empty"))
    add(Case("second-file-too-deep", "error", lambda r: one_bad_of_two(r, ("[" * 50000 + "]" * 50000 + "\n").encode()), 1,
             r"b\.jsonl:1: a JSON array|b\.jsonl:1: JSON nested too deeply"))

    def out_is_file(root: Path) -> list[str]:
        (root / "x.jsonl").write_bytes(good)
        (root / "outfile").write_text("keep me")
        return ["ingest", str(root / "x.jsonl"), "--out", str(root / "outfile")]

    add(Case("out-is-a-file", "error", out_is_file, 2, r"--out"))

    def out_is_cwd(root: Path) -> list[str]:
        (root / "x.jsonl").write_bytes(good)
        os.chdir(root)
        return ["ingest", str(root / "x.jsonl"), "--out", "."]

    add(Case("out-is-the-working-folder", "error", out_is_cwd, 2, r"--out \.: is the working folder", out="."))

    # An output folder inside the input folder: its earlier shards (and stats.json) are not inputs again.
    def out_inside_input(root: Path) -> list[str]:
        write_jsonl(root / "logs" / "r.jsonl", records(real))
        args = _ingest(str(root / "logs"), out=str(root / "logs" / "out"), extra=("--format", "auto"))
        assert invoke(args).exit_code == 0
        return args

    add(Case("out-inside-input-folder", "handled", out_inside_input, 0, out="logs/out",
             stats={"rollouts": n, "files": 1, "quarantined_total": 0}))

    def reingest_output(root: Path) -> list[str]:
        write_jsonl(root / "r.jsonl", records(real))
        assert invoke(_ingest(str(root / "r.jsonl"), out=str(root / "first"))).exit_code == 0
        return _ingest(str(root / "first"), out=str(root / "out"), extra=("--round", "5"))

    add(Case("reingest-an-output-folder", "handled", reingest_output, 0, stats={"rollouts": n, "files": 1, "format": "canonical"}))

    # Hangs end: a symlink loop under a ** glob or a folder input.
    def loop(root: Path, as_glob: bool) -> list[str]:
        d = root / "logs" / "sub"
        d.mkdir(parents=True)
        (d / "r.jsonl").write_bytes(good)
        os.symlink("..", d / "up")  # logs/sub/up -> logs: a cycle
        os.symlink(str(root / "logs"), d / "again")
        source = str(root / "logs" / "**" / "*.jsonl") if as_glob else str(root / "logs")
        return _ingest(source, out=str(root / "out"), extra=("--format", "openrlhf"))

    add(Case("symlink-loop-glob", "handled", lambda r: loop(r, True), 0, stats={"rollouts": n, "files": 1}, max_seconds=20))
    add(Case("symlink-loop-folder", "handled", lambda r: loop(r, False), 0, stats={"rollouts": n, "files": 1}, max_seconds=20))
    return cases


@pytest.fixture(scope="module")
def old_output(tmp_path_factory, real) -> Path:
    """A previous, valid ingest output: every failing case starts from a copy and must leave it as it was."""
    d = tmp_path_factory.mktemp("old")
    write_jsonl(d / "r.jsonl", records(real, hinted=False))
    res = invoke(["ingest", str(d / "r.jsonl"), "--out", str(d / "out"), "--format", "openrlhf"])
    assert res.exit_code == 0, res.output
    return d / "out"


def _cases():
    # The table is built from the real data at collection time (ids only); the fixtures give the data.
    from conftest import GSM8K_EXAMPLE
    from mentor.data import bundled

    if not GSM8K_EXAMPLE.exists():
        return []
    with open(GSM8K_EXAMPLE, encoding="utf-8") as fh:
        real = [json.loads(next(fh)) for _ in range(6)]
    return make_cases(real, bundled("gsm8k_rollouts.parquet"))


CASES = _cases()


@pytest.mark.parametrize("case", params(CASES))
def test_ingest_bad_input(case: Case, tmp_path, old_output, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_case(case, tmp_path / "case", prepare_out=lambda out: shutil.copytree(old_output, out) if case.out != "." else None)


def test_corpus_covers_the_issue_classes(shared_data):  # the corpus is built from the real data (skips without it)
    ids = {c.id for c in CASES}
    for needed in ("bom-first-record-kept", "second-file-not-utf8", "openrlhf-pid-null", "max-response-bytes-0",
                   "jsonl-sample-idx-fractions", "openrlhf-round-string", "deep-json-nesting", "symlink-loop-glob",
                   "openrlhf-no-problems-recovered", "problems-bundled-name"):
        assert needed in ids
    assert len(CASES) >= 80


JSON_VALUES = [None, True, False, 0, 1, -1, 0.5, 2.0, 2**40, 2**70, -(2**70), 10**400, "", " ", "x", "0", "1.5", "true",
               [], [1], {}, {"a": [1, {"b": None}]}, float("nan"), float("inf"), "\ud800"]


@pytest.mark.parametrize("fmt", ["openrlhf", "jsonl", "verl"])
@pytest.mark.parametrize("value", JSON_VALUES, ids=[repr(v)[:12] for v in JSON_VALUES])
def test_any_json_value_in_any_field(fmt, value, real, tmp_path):
    """Every field of every record set, one record each, to a value of another JSON type: no traceback,
    and every record read is accounted for (kept or quarantined by reason)."""
    if fmt == "openrlhf":
        rows = records(real)
    elif fmt == "jsonl":
        rows = [dict(r, round=1, hint_id=None, domain="math", truncated=False, step=3) for r in mapped(real)]
    else:
        rows = [{"input": r["question"], "output": r[m]["solution"], "score": float(r[m]["is_correct"]), "acc": 1.0, "gts": "1", "step": 1}
                for r in real for m in GSM8K_MODELS]
    fields = sorted({k for r in rows for k in r})
    for i, field in enumerate(fields):
        rows[i % len(rows)][field] = value
    write_jsonl(tmp_path / "logs" / "r.jsonl", rows)
    res = invoke(["ingest", str(tmp_path / "logs"), "--format", fmt, "--out", str(tmp_path / "out")])
    assert res.exception is None or isinstance(res.exception, SystemExit), (field, res.exception)
    assert "Traceback" not in res.output
    if res.exit_code == 0:
        stats = json.loads((tmp_path / "out" / "stats.json").read_text())
        assert stats["rows_read"] == len(rows) == stats["rollouts"] + stats["quarantined_total"], stats
    else:
        assert res.exit_code in (1, 2) and res.output.count("Error:") == 1, res.output
        assert not (tmp_path / "out").exists()
