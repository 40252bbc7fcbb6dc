"""Bundle the reference solutions of the bundled sets (what the hint agents and the judge check read).

    python -m mentor.data.convert_solutions [SHARED_DATA_DIR]

Writes beside this file, each with ``problem_id`` (the same ids as the set's
``*_problems.parquet`` and the bundled rollouts) and ``solution``:

- ``gsm8k_solutions.parquet``: GSM8K's worked answer as published (``<<calc>>``
  annotations and the ``#### answer`` line included);
- ``math500_solutions.parquet``: MATH-500's ``solution`` (LaTeX, the answer boxed);
- ``humaneval_solutions.parquet``: HumanEval's ``canonical_solution`` (the function body).

MIT, like the sets themselves (``licenses/``). Output is deterministic.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pyarrow as pa

from mentor.pipeline.ids import text_id
from mentor.pipeline.io import write_parquet_atomic

HERE = Path(__file__).resolve().parent
SOLUTIONS = "gsm8k_solutions.parquet"
SOLUTION_FILES = (SOLUTIONS, "math500_solutions.parquet", "humaneval_solutions.parquet")


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def convert(shared: Path, out: Path = HERE) -> list[Path]:
    sets = {
        SOLUTIONS: [(text_id(r["question"]), r["answer"]) for r in _jsonl(shared / "gsm8k" / "test.jsonl")],
        "math500_solutions.parquet": [("math500/" + r["unique_id"].removeprefix("test/").removesuffix(".json"), r["solution"])
                                      for r in _jsonl(shared / "math500" / "test.jsonl")],
        "humaneval_solutions.parquet": [(r["task_id"].lower(), r["canonical_solution"])
                                        for r in _jsonl(shared / "humaneval" / "HumanEval.jsonl.gz")],
    }
    return [write_parquet_atomic(pa.table({"problem_id": [i for i, _ in rows], "solution": [s for _, s in rows]}), out / name)
            for name, rows in sets.items()]


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[1] / "shared" / "data"
    for p in convert(root):
        print(p)
