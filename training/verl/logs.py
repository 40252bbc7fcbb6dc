"""verl's own rollout dumps as a log format: ``mentor ingest --format verl`` (the launcher's ``log_formats``).

verl writes ``trainer.rollout_data_dir/{step}.jsonl`` (``input``, ``output``, ``score``, ``gts``, and
``acc``/``step`` where its reward gives them): a run mentor does not launch (an ``external`` trainer, or
logs from elsewhere) is ingested from them. The prompt as sent is all a dump has of the problem, so its id
is the prompt's hash (`mentor.pipeline.ids.text_id`); `mentor ingest` recovers the problem text after.
mentor's own verl rounds log mentor's records instead (`mentor.training.verl.reward`).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pyarrow as pa

from mentor.pipeline.errors import DataError
from mentor.pipeline.ids import text_id
from mentor.pipeline.log_rows import LogFormat, iter_jsonl, number, rollout_table, rows_of, step_of, text
from mentor.pipeline.stage import Stats


def read_dumps(path: Path, round_: int, domain: str, stats: Stats, seen: Counter | None = None) -> pa.Table:
    """verl dump rows; `seen` numbers samples per problem across all files of one ingest."""
    seen = Counter() if seen is None else seen
    m = re.match(r"^(\d+)", path.stem)
    file_step = int(m.group(1)) if m else None

    def make(lineno: int, rec: dict) -> dict:
        prompt, output = rec.get("input"), rec.get("output")
        if not isinstance(prompt, str) or not isinstance(output, str):
            raise DataError(f"{path}:{lineno}: column 'input' or 'output' missing or not text; is this a verl rollout dump?")
        correct = rec["acc"] if "acc" in rec else rec.get("score")
        pid = text_id(prompt)
        idx = seen[pid]  # sample_idx is unique per problem within the round, across steps and files
        seen[pid] += 1
        return {
            "problem_id": pid,
            "round": round_,
            "sample_idx": idx,
            "problem": None,
            "prompt": prompt,
            "response": output,
            "correct": number(correct),
            "reward": number(rec.get("score")),
            "domain": domain,
            "label": text(rec.get("gts")),
            "source": "verl",
            "step": step_of(rec.get("step", file_step)),
        }

    return rollout_table(rows_of(path, stats, iter_jsonl(path, stats), make))


DUMPS = LogFormat("verl", "verl ``trainer.rollout_data_dir`` dumps (``{step}.jsonl``)", frozenset({"input", "output", "score"}),
                  read_dumps)


__all__ = ["DUMPS", "read_dumps"]
