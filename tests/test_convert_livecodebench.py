"""LiveCodeBench rows -> PROBLEMS with stdio code labels that mentor's verifier runs."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

from mentor.data.convert_livecodebench import problems_from_rows
from mentor.pipeline.schemas import check_schema


def _row(qid, cases, private=None, starter=""):
    return {
        "question_id": qid,
        "question_content": "Read two integers and print their sum.",
        "starter_code": starter,
        "public_test_cases": json.dumps(cases),
        "private_test_cases": base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private or [])))).decode(),
    }


def test_rows_become_stdio_labels_that_verify():
    from mentor.training.verify import verify_code

    stdin = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    rows = [_row("abc1", stdin, private=[{"input": "5 5\n", "output": "10\n", "testtype": "stdin"}]),
            _row("lc2", [{"input": "[1]", "output": "1", "testtype": "functional"}]),
            _row("none", [])]
    table, skipped = problems_from_rows(rows, private=True)
    assert check_schema(table.schema, "problems") == []
    assert table.column("problem_id").to_pylist() == ["lcb/abc1"]
    assert dict(skipped) == {"functional_tests": 1, "no_tests": 1}
    label = json.loads(table.column("label")[0].as_py())
    assert label["kind"] == "stdio" and len(json.loads(label["tests"])) == 2
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    bad = "```python\nprint(0)\n```"
    assert verify_code(good, table.column("label")[0].as_py()) == 1.0
    assert verify_code(bad, table.column("label")[0].as_py()) == 0.0
