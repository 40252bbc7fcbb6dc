"""Convert the public data in ../shared/data into mentor's canonical datasets.

    python -m mentor.workflows.convert_shared [SHARED_DATA_DIR]

Writes into data/ (`mentor.data.DATA_DIR`; it runs the ingest stage for the rollouts, so it lives in workflows/,
above the stages, while data/ holds the files):
- ``gsm8k_rollouts.parquet``   real GSM8K rollout logs (4 model samples per problem), schema: rollouts
- ``gsm8k_problems.parquet``   GSM8K test set, schema: problems (same problem_ids as the rollouts)
- ``math500_problems.parquet`` MATH-500, schema: problems
- ``humaneval_problems.parquet`` HumanEval, schema: problems (label = JSON tests + entry point + the prompt as setup)
and copies each source's licence into ``licenses/``. Output is deterministic.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

from mentor.data import DATA_DIR
from mentor.pipeline.ids import text_id
from mentor.pipeline.io import write_parquet_atomic
from mentor.pipeline.schemas import code_label
from mentor.stages.ingest import INGEST

HERE = DATA_DIR  # the bundled files live in data/ (`mentor.data`)


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def problems_table(rows: list[dict]) -> pa.Table:
    cols = {k: [r[k] for r in rows] for k in ("problem_id", "domain", "problem", "label", "data_source")}
    return pa.table(cols)


def convert(shared: Path, out: Path = HERE) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        INGEST({"sources": [str(shared / "gsm8k/example_model_solutions.jsonl")]},
               {"format": "gsm8k-example", "round": 0}, tmp)
        shutil.copyfile(Path(tmp) / "part-00000.parquet", out / "gsm8k_rollouts.parquet")

    gsm = [
        {
            "problem_id": text_id(r["question"]),
            "domain": "math",
            "problem": r["question"],
            "label": r["answer"].rsplit("####", 1)[-1].strip(),
            "data_source": "openai/gsm8k",
        }
        for r in _jsonl(shared / "gsm8k/test.jsonl")
    ]
    write_parquet_atomic(problems_table(gsm), out / "gsm8k_problems.parquet", dataset="problems")

    math500 = [
        {
            "problem_id": "math500/" + r["unique_id"].removeprefix("test/").removesuffix(".json"),
            "domain": "math",
            "problem": r["problem"],
            "label": r["answer"],
            "data_source": "HuggingFaceH4/MATH-500",
        }
        for r in _jsonl(shared / "math500/test.jsonl")
    ]
    write_parquet_atomic(problems_table(math500), out / "math500_problems.parquet", dataset="problems")

    humaneval = [
        {
            "problem_id": r["task_id"].lower(),
            "domain": "code",
            "problem": r["prompt"],
            # The prompt travels as trusted setup: some tests call its helpers (poly, encode_cyclic).
            "label": code_label(r["test"], r["entry_point"], "humaneval", setup=r["prompt"]),
            "data_source": "openai/humaneval",
        }
        for r in _jsonl(shared / "humaneval/HumanEval.jsonl.gz")
    ]
    write_parquet_atomic(problems_table(humaneval), out / "humaneval_problems.parquet", dataset="problems")

    lic = out / "licenses"
    lic.mkdir(exist_ok=True)
    for name in ("gsm8k", "math500", "humaneval"):
        shutil.copyfile(shared / name / "LICENSE", lic / f"LICENSE.{name}")


if __name__ == "__main__":
    convert(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent.parent / "shared" / "data")
