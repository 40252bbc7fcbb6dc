"""Resumable shards: a stage's work cut into shards, each computed once and vouched for by a done marker.

The executor layer owns completion. A stage says what one shard computes (a
top-level function, so that a dask worker can run it) and what its output
depends on; a `ShardPlan` decides which shards are done, runs the others over an
`mentor.pipeline.executor.Executor` (in this process, or on dask workers that
each keep one engine), writes each one and its marker, and removes what an
earlier run left. One layout for every stage that shards its work (hint,
rollout, rescue)::

    <folder>/part-00000.parquet       shard 0's rows
    <folder>/_done/part-00000.json    its done marker: the shard's key, its rows, and what the
                                      stage records of it (counters, token counts)

A shard's key hashes the run's config fingerprint (the settings that change
outputs, the model, the schema version) with the shard's input fingerprint
(its items; and its position when outputs depend on it, e.g. positional
seeds). A shard is done when its Parquet exists and its marker carries its
key: unlike completion by worker rank, that survives a change of the shard
count, and a changed input or config recomputes exactly the shards whose key
changed while finished ones are reused. A shard is (re)computed as: its old
marker removed, the Parquet written atomically, then the marker, then the
fault point ``<stage>.after_shard``; so a run killed anywhere (kill -9) leaves
every shard either done or to be redone, never read half-written or under an
earlier run's marker. `ShardPlan.complete` is the one loop a stage runs its shards with.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mentor.pipeline.errors import EngineError
from mentor.pipeline.executor import LOCAL, Executor
from mentor.pipeline.faults import fault_point
from mentor.pipeline.ids import content_hash
from mentor.pipeline.io import config_hash, write_parquet_atomic
from mentor.pipeline.llm import engine_starts
from mentor.pipeline.stage import read_done, write_done

if TYPE_CHECKING:
    import pyarrow as pa

DONE = "_done"
_PART = re.compile(r"part-\d{5,}\.(parquet|json)")


@dataclass(frozen=True)
class Shard:
    """One shard's work (small enough to ship to a dask worker) and where it is written."""

    stage: str
    index: int
    total: int
    start: int  # position of items[0] in the whole input
    key: str
    items: list
    path: Path
    marker: Path
    dataset: str | None = None

    def done(self) -> dict[str, Any] | None:
        """The marker's content when the shard's output is complete (for this key), else None."""
        return read_done(self.marker, self.key) if self.path.is_file() else None

    def failure(self, exc: Exception, what: str, detail: str = "", kept: str = "Finished shards are kept") -> EngineError:
        """The one error a failed shard is reported as: which shard, `what` it held, and that a rerun resumes."""
        return EngineError(f"{self.stage}: shard {self.index + 1} of {self.total} ({what}) failed{detail}: {exc}. "
                           f"{kept}: rerun the same command to redo only the unfinished ones")


@dataclass
class ShardResult:
    """A shard's done marker content; for a shard computed by this run, where and when it ran."""

    index: int
    record: dict[str, Any]
    reused: bool
    ran: dict[str, Any] | None = None


@dataclass
class Completed:
    """What `ShardPlan.complete` did: the results this run computed (with where and when each ran), how many reused."""

    computed: list[ShardResult]
    reused: int

    @property
    def runs(self) -> list[dict[str, Any]]:
        return [r.ran for r in self.computed]


# compute(shard, *args) -> (the shard's rows, what its marker records besides index and rows)
Compute = Callable[..., "tuple[pa.Table, dict[str, Any]]"]


def rows_hash(obj: Any) -> str:
    """A content hash of JSON-able input (a shard's rows)."""
    return content_hash(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str), length=24)


def compute_shard(shard: Shard, compute: Compute, *args: Any) -> ShardResult:
    """Compute one shard and write it (Parquet, then marker); a done shard is not recomputed. Top-level: picklable."""
    marker = shard.done()
    if marker is not None:  # e.g. a dask task retried after its worker died past the marker
        return ShardResult(shard.index, marker, reused=True)
    shard.marker.unlink(missing_ok=True)  # an earlier run's marker must never vouch for this run's Parquet
    started, starts = time.time(), engine_starts()
    table, record = compute(shard, *args)
    write_parquet_atomic(table, shard.path, dataset=shard.dataset)
    record = {"index": shard.index, "rows": table.num_rows, **record}
    write_done(shard.marker, shard.key, **record)
    fault_point(f"{shard.stage}.after_shard")
    ran = {"index": shard.index, "worker": f"{socket.gethostname()}:{os.getpid()}", "started": round(started, 3),
           "finished": round(time.time(), 3), "engine_started": engine_starts() > starts}
    return ShardResult(shard.index, record, reused=False, ran=ran)


class ShardPlan:
    """`items` cut into shards of `size` under `folder`, keyed by `config` and each shard's items.

    - `view(item)`: what of an item its output depends on (default: the item itself, JSON-able);
    - `by_position`: the shard's position enters its key too (outputs depend on positions);
    - `owns_folder`: `finish` may remove any other file of `folder` (it holds shards only);
      otherwise only ``part-*`` files (the folder is also the stage's output).
    """

    def __init__(self, folder: str | Path, stage: str, items: Sequence, size: int, config: Mapping[str, Any],
                 view: Callable[[Any], Any] | None = None, by_position: bool = False, dataset: str | None = None,
                 owns_folder: bool = False) -> None:
        self.folder, self.stage, self.owns_folder = Path(folder), stage, owns_folder
        run_key = config_hash(dict(config))
        starts = range(0, len(items), size)
        self.shards: list[Shard] = []
        for index, start in enumerate(starts):
            chunk = list(items[start : start + size])
            inputs = rows_hash(chunk if view is None else [view(it) for it in chunk])
            key = content_hash(run_key, inputs, *([str(start)] if by_position else []), length=24)
            name = f"part-{index:05d}"
            self.shards.append(Shard(stage, index, len(starts), start, key, chunk, self.folder / f"{name}.parquet",
                                     self.folder / DONE / f"{name}.json", dataset))
        self.done: dict[int, dict[str, Any]] = {}
        for s in self.shards:
            marker = s.done()
            if marker is not None:
                self.done[s.index] = marker

    def run(self, compute: Compute, *args: Any, executor: Executor = LOCAL) -> Iterator[tuple[Shard, ShardResult]]:
        """Every shard with its result, in shard order: a done one's from its marker (nothing computed),
        the others computed by `compute_shard` through `executor` (default: this process, one by one)."""
        todo = [s for s in self.shards if s.index not in self.done]
        computed = executor.imap(compute_shard, todo, compute, *args) if todo else iter(())
        for s in self.shards:
            if s.index in self.done:
                yield s, ShardResult(s.index, self.done[s.index], reused=True)
            else:
                yield s, next(computed)

    def complete(self, compute: Compute, *args: Any, executor: Executor = LOCAL,
                 each: Callable[[Shard, ShardResult], None] | None = None) -> "Completed":
        """The one resume loop of every sharded stage: each shard done (a done one's marker reused, the others
        computed through `executor`), `each(shard, result)` told in shard order (to merge counters, move a bar),
        then what earlier runs left removed (`finish`). Returns which shards this run computed."""
        done = Completed(computed=[], reused=0)
        for shard, res in self.run(compute, *args, executor=executor):
            if each is not None:
                each(shard, res)
            if res.reused:
                done.reused += 1
            else:
                done.computed.append(res)
        self.finish()
        return done

    def finish(self) -> None:
        """Remove what earlier runs left that is not part of this one; call once every shard is done."""
        keep = {s.path.name for s in self.shards}
        marks = {s.marker.name for s in self.shards}
        for folder, names in ((self.folder, keep), (self.folder / DONE, marks)):
            for f in folder.iterdir() if folder.is_dir() else ():
                if f.is_file() and f.name not in names and (self.owns_folder or _PART.fullmatch(f.name)):
                    f.unlink()


__all__ = ["DONE", "Completed", "Shard", "ShardPlan", "ShardResult", "compute_shard", "rows_hash"]
