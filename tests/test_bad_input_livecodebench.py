"""`python -m mentor.data.convert_livecodebench` over malformed LiveCodeBench release files.

Each case writes a release folder (``test.jsonl``, LiveCodeBench's row format: see
test_convert_livecodebench.py) holding the good rows and one bad thing, and runs the converter
as a user does. A bad line or row is left out and counted and the good rows of the same file are
kept; a bad command line (an output that is a folder, a cap of 0 MiB) is one line and exit 2;
never a traceback, never a partial output, and the decompression cap always holds.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import polars as pl
import pytest

from test_convert_livecodebench import FUNCTIONAL_ROW, STDIN_ROW

GOOD = [STDIN_ROW, STDIN_ROW | {"question_id": "abc999_b"}]
GOOD_IDS = ["lcb/abc999_a", "lcb/abc999_b"]


def _private(value, compress=zlib.compress) -> str:
    return base64.b64encode(compress(pickle.dumps(value))).decode()


def _release(root: Path, *lines: bytes | str | dict, good: bool = True) -> Path:
    d = root / "release"
    d.mkdir(parents=True, exist_ok=True)
    body = b""
    rows = [*(GOOD[:1] if good else []), *lines, *(GOOD[1:] if good else [])]  # the bad one between two good ones
    for row in rows:
        body += (row if isinstance(row, bytes) else (row if isinstance(row, str) else json.dumps(row)).encode()) + b"\n"
    (d / "test.jsonl").write_bytes(body)
    return d


def _convert(root: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mentor.data.convert_livecodebench", str(out), "--from", str(root / "release"),
                           "--version", "release_v1", *args], capture_output=True, text=True, timeout=600,
                          env=os.environ | {"HF_DATASETS_CACHE": str(root / "ds")})


def _bomb(mib: int) -> str:
    """Private tests that inflate to `mib` MiB (a pickled JSON string of one huge case)."""
    cases = json.dumps([{"input": "1", "output": "x" * (mib << 20), "testtype": "stdin"}])
    return _private(cases, lambda b: zlib.compress(b, 9))


ROW_CASES = [
    # (id, a bad line, the count it must add)
    ("not-utf8", b'{"question_id": "x", "question_content": "\xff\xfe"}', "line_not_utf8"),
    ("torn-line", '{"question_id": "x", "public_test_cases": "[', "line_not_json"),
    ("a-json-list", "[1, 2, 3]", "not_an_object"),
    ("a-json-number", "42", "not_an_object"),
    ("deeply-nested", "[" * 100_000 + "]" * 100_000, "line_not_json"),
    ("private-a-number", STDIN_ROW | {"question_id": "p1", "private_test_cases": 12345}, "tests_unreadable"),
    ("private-a-list", STDIN_ROW | {"question_id": "p2", "private_test_cases": [{"input": "1", "output": "2"}]}, "tests_unreadable"),
    ("private-a-mapping", STDIN_ROW | {"question_id": "p3", "private_test_cases": {"input": "1"}}, "tests_unreadable"),
    ("private-pickled-mapping", STDIN_ROW | {"question_id": "p4", "private_test_cases": _private({"a": 1})}, "tests_unreadable"),
    ("private-cases-wrong-types", STDIN_ROW | {"question_id": "p5", "private_test_cases": _private(json.dumps([{"input": 1, "output": 2}]))},
     "tests_unreadable"),
    ("public-a-list", STDIN_ROW | {"question_id": "q1", "public_test_cases": [{"input": "1", "output": "2"}]}, "tests_unreadable"),
    ("public-not-json", STDIN_ROW | {"question_id": "q2", "public_test_cases": "{not json"}, "tests_unreadable"),
    ("testtype-a-list", STDIN_ROW | {"question_id": "q3", "public_test_cases": json.dumps([{"input": "1", "output": "2", "testtype": ["stdin"]}]),
                                     "private_test_cases": ""}, "tests_unreadable"),
    ("question-id-a-mapping", STDIN_ROW | {"question_id": {"id": 1}}, "question_id_invalid"),
    ("question-id-true", STDIN_ROW | {"question_id": True}, "question_id_invalid"),
    ("question-content-a-list", STDIN_ROW | {"question_id": "c1", "question_content": ["a", "b"]}, "text_not_a_string"),
    ("starter-code-a-number", STDIN_ROW | {"question_id": "c2", "starter_code": 7}, "text_not_a_string"),
    ("metadata-a-number", FUNCTIONAL_ROW | {"metadata": 5}, "functional_without_func_name"),
    ("functional-input-nested-too-deep", FUNCTIONAL_ROW | {"question_id": "f1", "private_test_cases": "", "public_test_cases": json.dumps(
        [{"input": "[" * 5000 + "]" * 5000, "output": "1", "testtype": "functional"}])}, "tests_unreadable"),
    ("duplicate-id", STDIN_ROW, "duplicate_question_id"),
]


@pytest.mark.parametrize("bad,count", [pytest.param(line, count, id=cid) for cid, line, count in ROW_CASES])
def test_a_bad_row_is_counted_and_the_good_rows_kept(bad, count, tmp_path):
    _release(tmp_path, bad)
    res = _convert(tmp_path, tmp_path / "out.parquet")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    summary = json.loads(res.stdout)
    assert summary["counts"].get(count) == 1, summary
    assert pl.read_parquet(tmp_path / "out.parquet")["problem_id"].to_list()[:2] == GOOD_IDS


def test_a_file_of_nothing_usable_is_an_error_and_writes_nothing(tmp_path):
    _release(tmp_path, b"\xff\xfe\x00garbage", "[]", good=False)
    res = _convert(tmp_path, tmp_path / "out.parquet")
    assert res.returncode == 1 and res.stderr.startswith("Error: ") and "no usable problem" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out.parquet").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_the_decompression_cap_holds_and_cannot_be_switched_off(tmp_path):
    _release(tmp_path, STDIN_ROW | {"question_id": "bomb", "private_test_cases": _bomb(48)})
    res = _convert(tmp_path, tmp_path / "out.parquet", "--max-test-mb", "8")
    assert res.returncode == 0 and json.loads(res.stdout)["counts"]["too_large"] == 1, res.stderr
    assert "lcb/bomb" not in pl.read_parquet(tmp_path / "out.parquet")["problem_id"].to_list()
    for bad in ("0", "-1", "65537", "ten", "1e3"):
        res = _convert(tmp_path, tmp_path / f"out-{bad}.parquet", "--max-test-mb", bad)
        assert res.returncode == 2 and "--max-test-mb" in res.stderr and "Traceback" not in res.stderr, (bad, res.stderr)
        assert not (tmp_path / f"out-{bad}.parquet").exists()
    from mentor.data.convert_livecodebench import decode_private, problems_from_rows

    with pytest.raises(ValueError, match="max_bytes must be >= 1"):
        decode_private(_bomb(1), max_bytes=0)
    with pytest.raises(ValueError, match="max_bytes must be >= 1"):
        problems_from_rows(GOOD, max_bytes=0)


def test_an_output_that_is_a_folder_or_unwritable_is_one_line(tmp_path):
    _release(tmp_path)
    (tmp_path / "out").mkdir()
    res = _convert(tmp_path, tmp_path / "out")
    assert res.returncode == 2 and "out: is a folder; give the Parquet file to write" in res.stderr
    assert "Traceback" not in res.stderr and list((tmp_path / "out").iterdir()) == []
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    try:
        res = _convert(tmp_path, tmp_path / "ro" / "out.parquet")
    finally:
        (tmp_path / "ro").chmod(0o700)
    if os.geteuid() != 0:  # root writes anyway
        assert res.returncode == 1 and res.stderr.startswith("Error: ") and "Traceback" not in res.stderr
    res = _convert(tmp_path, tmp_path / "no-such-folder" / "deeper" / "out.parquet")
    assert "Traceback" not in res.stderr and res.returncode in (0, 1)
