"""LiveCodeBench's released files -> PROBLEMS -> the real code verifier, for stdin and functional problems.

The rows are written in LiveCodeBench's own format (code_generation_lite's ``test*.jsonl``: the
fields of ``lcb_runner/benchmarks/code_generation.py``, public tests as a JSON string, private
tests as base64 of zlib of a pickled JSON string), read from a folder and from a Hugging Face
cache laid out as huggingface_hub lays it out, through the converter's command line.
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

from mentor.data.convert_livecodebench import (
    decode_private,
    functional_supported,
    problems_from_rows,
    release_files,
)
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.schemas import check_schema
from mentor.training.verify import verify_code

pytest.importorskip("datasets")


def _private(cases) -> str:
    """LiveCodeBench's encoding of private tests."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


STDIN_ROW = {
    "question_title": "Sum of A and B", "question_content": "You are given two integers A and B. Print A+B.",
    "platform": "atcoder", "question_id": "abc999_a", "contest_id": "abc999", "contest_date": "2024-08-03T00:00:00",
    "starter_code": "", "difficulty": "easy",
    "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
    "private_test_cases": _private([{"input": "5 5\n", "output": "10\n", "testtype": "stdin"},
                                    {"input": "-7 3\n", "output": "-4\n", "testtype": "stdin"}]),
    "metadata": "{}",
}
FUNCTIONAL_ROW = {
    "question_title": "max-pair-sum", "question_content": "Return the largest sum of k elements of nums, and the k used.",
    "platform": "leetcode", "question_id": "3999", "contest_id": "weekly-contest-999", "contest_date": "2024-08-04T00:00:00",
    "starter_code": "class Solution:\n    def maxSum(self, nums: List[int], k: int) -> List[int]:\n        ",
    "difficulty": "medium",
    "public_test_cases": json.dumps([{"input": "[1, 5, 3]\n2", "output": "[8, 2]", "testtype": "functional"}]),
    "private_test_cases": _private([{"input": "[4]\n1", "output": "[4, 1]", "testtype": "functional"},
                                    {"input": "[-1, -2, 7, 0]\n3", "output": "[6, 3]", "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "maxSum"}),
}
GOOD_STDIN = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
PUBLIC_ONLY_STDIN = "```python\ninput()\nprint(3)\n```"  # passes the public test only
GOOD_FUNCTIONAL = ("```python\nclass Solution:\n    def maxSum(self, nums: List[int], k: int) -> List[int]:\n"
                   "        return (sum(sorted(nums)[-k:]), k)\n```")  # a tuple: counts as a list, as in LiveCodeBench
WRONG_FUNCTIONAL = ("```python\nclass Solution:\n    def maxSum(self, nums, k):\n        return [sum(nums[:k]), k]\n```")


@pytest.fixture
def release(tmp_path) -> Path:
    d = tmp_path / "code_generation_lite"
    d.mkdir()
    (d / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (STDIN_ROW, FUNCTIONAL_ROW)))
    (d / "test2.jsonl").write_text(json.dumps(STDIN_ROW | {"question_id": "abc999_b"}) + "\n")
    return d


def _convert(out: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mentor.data.convert_livecodebench", str(out), *args],
                          capture_output=True, text=True, env=os.environ | (env or {}), timeout=600)


def test_release_files_read_through_the_converter_and_verified(release, tmp_path):
    res = _convert(tmp_path / "lcb.parquet", "--from", str(release), "--version", "release_v2")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["files"] == ["test.jsonl", "test2.jsonl"]
    df = pl.read_parquet(tmp_path / "lcb.parquet")
    import pyarrow.parquet as pq

    assert check_schema(pq.read_schema(tmp_path / "lcb.parquet"), "problems") == []
    stdin = df.filter(pl.col("problem_id") == "lcb/abc999_a").row(0, named=True)
    label = json.loads(stdin["label"])
    assert label["kind"] == "stdio" and len(json.loads(label["tests"])) == 3  # 1 public + 2 private
    assert "standard input" in stdin["problem"]
    assert verify_code(GOOD_STDIN, stdin["label"]) == 1.0
    assert verify_code(PUBLIC_ONLY_STDIN, stdin["label"]) == 0.0  # the private tests catch it
    assert df.filter(pl.col("problem_id") == "lcb/abc999_b").height == 1  # test2.jsonl was read too
    if functional_supported():
        assert summary["counts"]["functional"] == 1
        fn = df.filter(pl.col("problem_id") == "lcb/3999").row(0, named=True)
        assert "class Solution:" in fn["problem"] and json.loads(fn["label"])["entry_point"] == "Solution.maxSum"
        assert verify_code(GOOD_FUNCTIONAL, fn["label"]) == 1.0
        assert verify_code(WRONG_FUNCTIONAL, fn["label"]) == 0.0
    else:  # a verifier without methods would score every functional problem 0: left out, counted, said
        assert summary["counts"]["functional_unsupported"] == 1 and df.height == 2
        assert "cannot call a method of class Solution" in res.stderr


def test_functional_labels_verify(tmp_path):
    """The functional label against the real verifier (needs one that resolves `Solution.<method>`)."""
    table, counts = problems_from_rows([FUNCTIONAL_ROW], functional=True)
    label = table.column("label")[0].as_py()
    tests = json.loads(label)["tests"]
    assert "CASES = json.loads(" in tests and counts["functional"] == 1
    ns: dict = {}
    exec(tests, ns)  # the test data: LiveCodeBench's inputs, one JSON value per line = one argument
    assert ns["CASES"] == [[[[1, 5, 3], 2], [8, 2]], [[[4], 1], [4, 1]], [[[-1, -2, 7, 0], 3], [6, 3]]]
    assert functional_supported()  # the verifier resolves a Solution.<method> entry point
    assert verify_code(GOOD_FUNCTIONAL, label) == 1.0
    assert verify_code(WRONG_FUNCTIONAL, label) == 0.0
    assert verify_code("```python\ndef maxSum(nums, k):\n    return [8, 2]\n```", label) == 0.0  # no class Solution


def test_read_from_the_hugging_face_cache(release, tmp_path):
    """huggingface_hub's cache layout (datasets--ORG--NAME/refs/main + snapshots/REV/), offline."""
    cache = tmp_path / "hub"
    repo = cache / "datasets--livecodebench--code_generation_lite"
    rev = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "snapshots").mkdir()
    os.symlink(release, repo / "snapshots" / rev)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "ds")}
    res = _convert(tmp_path / "v1.parquet", "--version", "release_v1", env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["files"] == ["test.jsonl"]
    assert "lcb/abc999_a" in pl.read_parquet(tmp_path / "v1.parquet")["problem_id"].to_list()
    res = _convert(tmp_path / "v6.parquet", "--version", "release_v6", env=env)
    assert res.returncode == 2 and "missing test3.jsonl" in res.stderr and "Traceback" not in res.stderr
    res = _convert(tmp_path / "x.parquet", "--version", "release_v1", env=env | {"HF_HUB_CACHE": str(tmp_path / "empty")})
    assert res.returncode == 2 and "not in the local Hugging Face cache" in res.stderr and "--from DIR" in res.stderr
    assert not (tmp_path / "x.parquet").exists()


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_private_tests_are_decoded_without_running_anything(tmp_path):
    _Evil.marker = tmp_path / "pwned"
    evil = base64.b64encode(zlib.compress(pickle.dumps(_Evil()))).decode()
    not_a_string = base64.b64encode(zlib.compress(pickle.dumps([{"input": "1", "output": "1"}]))).decode()
    rows = [STDIN_ROW | {"question_id": "evil", "private_test_cases": evil},
            STDIN_ROW | {"question_id": "list", "private_test_cases": not_a_string},
            STDIN_ROW | {"question_id": "garbage", "private_test_cases": "%%% not base64 %%%"},
            STDIN_ROW | {"question_id": "plain", "private_test_cases": json.dumps([{"input": "2 2\n", "output": "4\n", "testtype": "stdin"}])},
            STDIN_ROW | {"question_id": "none", "public_test_cases": "[]", "private_test_cases": ""},
            STDIN_ROW | {"question_id": "mixed", "public_test_cases": json.dumps([{"input": "1", "output": "1", "testtype": "functional"},
                                                                                   {"input": "1", "output": "1", "testtype": "stdin"}])},
            FUNCTIONAL_ROW | {"question_id": "nofn", "metadata": "{}"}]
    table, counts = problems_from_rows(rows, functional=True)
    assert not _Evil.marker.exists()  # os.system was never looked up, let alone called
    assert table.column("problem_id").to_pylist() == ["lcb/plain"]  # private tests given as plain JSON are read too
    assert dict(counts) == {"tests_unreadable": 3, "stdin": 1, "no_tests": 1, "mixed_test_types": 1,
                            "functional_without_func_name": 1}
    with pytest.raises(ValueError, match=r"tests name (posix|os)\.system; only plain values"):
        decode_private(evil)
    # A decompression bomb stops at the cap.
    big = _private([{"input": "x" * 100_000, "output": "1", "testtype": "stdin"}])
    _, capped = problems_from_rows([STDIN_ROW | {"private_test_cases": big}], max_bytes=10_000)
    assert dict(capped) == {"too_large": 1}
    assert len(decode_private(big)) == 1
    assert problems_from_rows([STDIN_ROW], private=False)[0].num_rows == 1


def test_version_tags_and_bad_input(tmp_path, release):
    assert release_files("release_v3") == ["test.jsonl", "test2.jsonl", "test3.jsonl"]
    assert release_files("v1") == ["test.jsonl"] and release_files("v5_v6") == ["test5.jsonl", "test6.jsonl"]
    assert len(release_files("release_latest")) == 6
    for bad in ("release_v9", "v3_v2", "latest"):
        with pytest.raises(ConfigError, match="not a LiveCodeBench version tag"):
            release_files(bad)
    # A torn line is left out and counted; the good rows of the release are kept.
    (release / "test2.jsonl").write_text('{"question_id": "x", \n')
    res = _convert(tmp_path / "torn.parquet", "--from", str(release), "--version", "release_v2")
    assert res.returncode == 0 and json.loads(res.stdout)["counts"]["line_not_json"] == 1, res.stderr
    assert "lcb/abc999_a" in pl.read_parquet(tmp_path / "torn.parquet")["problem_id"].to_list()
    # Nothing usable at all: an error, and no output.
    res = _convert(tmp_path / "bad.parquet", "--from", str(release), "--version", "v2")
    assert res.returncode == 1 and "no usable problem" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "bad.parquet").exists()
    res = _convert(tmp_path / "bad.parquet", "--from", str(tmp_path / "nope"))
    assert res.returncode == 2 and "no such folder" in res.stderr
