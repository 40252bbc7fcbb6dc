"""Convert LiveCodeBench (code_generation_lite) rows into a mentor PROBLEMS set.

    python -m mentor.data.convert_livecodebench OUT.parquet [--dataset livecodebench/code_generation_lite]
        [--version release_v5] [--split test] [--private]

LiveCodeBench's test cases are stdin/stdout pairs (``public_test_cases``: a
JSON list of ``{input, output, testtype}``; ``private_test_cases``: the same,
zlib-compressed, pickled and base64-encoded). Each problem becomes
``label = code_label(json cases, None, "stdio")``, which mentor's code verifier
runs in its sandbox. Problems whose tests are functional (LeetCode-style
``testtype == "functional"``) are skipped and counted: mentor's stdio runner
does not call methods. The dataset is read through the `datasets` library from
the local cache (offline: a clear error when it is not cached).

``--private`` also decodes the private cases; that unpickles data from the
dataset, so only use it on a copy you trust.
"""

from __future__ import annotations

import argparse
import base64
import json
import pickle
import zlib
from collections import Counter
from pathlib import Path

import pyarrow as pa

from mentor.pipeline.errors import DataError
from mentor.pipeline.io import write_parquet_atomic
from mentor.pipeline.schemas import code_label


def decode_private(blob: str) -> list[dict]:
    return json.loads(pickle.loads(zlib.decompress(base64.b64decode(blob.encode("utf-8")))))  # noqa: S301 - opt-in


def problems_from_rows(rows, private: bool = False, source: str = "livecodebench/code_generation_lite") -> tuple[pa.Table, Counter]:
    """PROBLEMS rows from LiveCodeBench rows; the counter says what was skipped and why."""
    out: dict[str, list] = {k: [] for k in ("problem_id", "domain", "problem", "label", "data_source")}
    skipped: Counter = Counter()
    for row in rows:
        try:
            cases = json.loads(row["public_test_cases"]) if row.get("public_test_cases") else []
            if private and row.get("private_test_cases"):
                cases += decode_private(row["private_test_cases"])
        except (ValueError, TypeError, zlib.error, pickle.UnpicklingError):
            skipped["tests_unreadable"] += 1
            continue
        if not cases:
            skipped["no_tests"] += 1
            continue
        if any(c.get("testtype", "stdin") != "stdin" for c in cases):
            skipped["functional_tests"] += 1
            continue
        problem = row["question_content"]
        if row.get("starter_code"):
            problem += "\n\nStarter code:\n" + row["starter_code"]
        out["problem_id"].append(f"lcb/{row['question_id']}")
        out["domain"].append("code")
        out["problem"].append(problem)
        out["label"].append(code_label(json.dumps([{"input": c["input"], "output": c["output"]} for c in cases]), None, "stdio"))
        out["data_source"].append(source)
    return pa.table(out), skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--dataset", default="livecodebench/code_generation_lite")
    ap.add_argument("--version", default="release_v5")
    ap.add_argument("--split", default="test")
    ap.add_argument("--private", action="store_true")
    args = ap.parse_args()
    try:
        import datasets

        ds = datasets.load_dataset(args.dataset, version_tag=args.version, split=args.split, trust_remote_code=True)
    except Exception as exc:  # the datasets library raises many kinds when offline
        raise DataError(f"{args.dataset}: cannot load it from the local Hugging Face cache ({exc}); download it on a "
                        "machine with network access first (HF_HOME)") from exc
    table, skipped = problems_from_rows(ds, private=args.private, source=args.dataset)
    write_parquet_atomic(table, Path(args.out), dataset="problems")
    print(json.dumps({"problems": table.num_rows, "skipped": dict(skipped)}))


if __name__ == "__main__":
    main()
