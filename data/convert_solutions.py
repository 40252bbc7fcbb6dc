"""Bundle the GSM8K test set's reference solutions (the judge check's known-good hints).

    python -m mentor.data.convert_solutions [SHARED_DATA_DIR]

Writes ``gsm8k_solutions.parquet`` beside this file: ``problem_id`` (the same ids as
``gsm8k_problems.parquet`` and the bundled rollouts) and ``solution`` (GSM8K's worked
answer as published, ``<<calc>>`` annotations and the ``#### answer`` line included).
MIT, like the rest of GSM8K (``licenses/LICENSE.gsm8k``). Output is deterministic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa

from mentor.pipeline.ids import text_id
from mentor.pipeline.io import write_parquet_atomic

HERE = Path(__file__).resolve().parent
SOLUTIONS = "gsm8k_solutions.parquet"


def convert(shared: Path, out: Path = HERE) -> Path:
    with open(shared / "gsm8k" / "test.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    table = pa.table({"problem_id": [text_id(r["question"]) for r in rows], "solution": [r["answer"] for r in rows]})
    return write_parquet_atomic(table, out / SOLUTIONS)


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[1] / "shared" / "data"
    print(convert(root))
