"""Every prompt of a verl round trains: the batch size and the repeated rows that make whole batches.

verl 0.9.1's ``RayPPOTrainer._create_dataloader`` builds its train dataloader with
``drop_last=True`` and a batch of ``data.gen_batch_size`` or ``data.train_batch_size``
(1024 by default), over a shuffled sampler (``data.shuffle`` true). An epoch then skips
``N mod batch`` prompts, a different random set each epoch (295 of GSM8K's 1,319 at 1024),
hinted ones included; with fewer prompts than one batch the dataloader is empty and verl
stops after start-up ("Train dataloader is empty!").

What mentor does (`plan_batches`), with N = the rows of the round's shards (all of which
verl's dataset keeps: mentor sets ``data.max_prompt_length`` to hold the longest):

- ``data.train_batch_size`` (or ``data.gen_batch_size``) set in the round's ``overrides``:
  more than N is refused before launch, with both numbers; otherwise the batch stays, and
  when it does not divide N the round gets ``batch - N mod batch`` extra rows;
- not set: mentor picks the batch. The steps are those of verl's 1024 (``ceil(N / 1024)``),
  the batch the smallest multiple of the round's GPU count that covers N in those steps
  (``ceil(N / steps)`` rounded up), so fewer rows are repeated than one GPU each per step;
  a round of fewer than 1024 prompts is one step with every prompt. When that batch is
  under verl's ``actor_rollout_ref.actor.ppo_mini_batch_size`` (256), mentor sets the mini
  batch to the batch (unless the overrides set it; verl's own check then speaks).

The extra rows are the round's first rows (shard order) repeated, written to
``<train>/verl-pad.parquet`` at launch and added to ``data.train_files``: with them the
epoch is whole batches, so verl's shuffled sampler puts every row, each original prompt
at least once, in a batch. `--dry-run` prints the plan (prompts, batch, steps, repeated rows).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mentor.pipeline.errors import ConfigError
from mentor.training.prompt_limits import positive_int

VERL_TRAIN_BATCH = 1024  # data.train_batch_size in verl 0.9.1's ppo_trainer config
VERL_MINI_BATCH = 256  # actor_rollout_ref.actor.ppo_mini_batch_size in verl 0.9.1
TRAIN_BATCH, GEN_BATCH = "data.train_batch_size", "data.gen_batch_size"
MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size"
PAD_FILE = "verl-pad.parquet"


@dataclass(frozen=True)
class BatchPlan:
    """How verl's dataloader will cut the round: `prompts` rows in `steps` batches of `batch` after `pad` repeats."""

    prompts: int
    batch: int
    key: str  # the key that sizes verl's dataloader batch
    pad: int
    set_batch: bool  # mentor sets `key` (the overrides did not)
    mini_batch: int | None  # mentor sets the actor's ppo_mini_batch_size to this

    @property
    def steps(self) -> int:
        return (self.prompts + self.pad) // self.batch

    def overrides(self) -> list[str]:
        out = [f"{self.key}={self.batch}"] if self.set_batch else []
        return out + ([f"{MINI_BATCH}={self.mini_batch}"] if self.mini_batch is not None else [])

    def describe(self) -> str:
        who = "set by mentor" if self.set_batch else "from the overrides"
        text = f"{self.prompts} prompts, {self.key}={self.batch} ({who}), {self.steps} step(s) per epoch"
        if self.pad:
            return text + (f"; verl drops an incomplete batch, so the round's first {self.pad} row(s) are repeated "
                           f"({PAD_FILE}) and every prompt trains")
        return text + "; every prompt trains (whole batches)"


def _given(overrides: dict[str, Any], key: str) -> Any:
    return next((v for k, v in overrides.items() if k.lstrip("+~") == key), None)


def count_rows(files: list[str]) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def plan_batches(prompts: int, overrides: dict[str, Any], gpus: int = 1) -> BatchPlan:
    """The batch plan of a round with `prompts` rows (see the module docstring); `gpus`: the round's GPU count."""
    key = GEN_BATCH if _given(overrides, GEN_BATCH) is not None else TRAIN_BATCH
    given = _given(overrides, key)
    if given is not None:
        batch = positive_int(given, f"overrides.{key}", "prompts")
        if prompts < batch:
            raise ConfigError(f"the round has {prompts} prompts, fewer than one batch ({key}={batch}): verl's dataloader "
                              "drops the last incomplete batch, so it would train on none (\"Train dataloader is empty!\"); "
                              f"set {key} to at most {prompts}, or leave it unset and mentor sizes it")
        return BatchPlan(prompts, batch, key, (-prompts) % batch, False, None)
    if prompts < 1:
        raise ConfigError("the round has no prompts: verl would train on none; run `mentor build` first")
    steps = math.ceil(prompts / VERL_TRAIN_BATCH)
    unit = max(1, gpus)
    batch = math.ceil(math.ceil(prompts / steps) / unit) * unit
    mini = batch if batch < VERL_MINI_BATCH and _given(overrides, MINI_BATCH) is None else None
    return BatchPlan(prompts, batch, key, steps * batch - prompts, True, mini)


def pad_path(train_path: Path) -> Path:
    return train_path / PAD_FILE


def write_pad(files: list[str], plan: BatchPlan, out: Path) -> Path | None:
    """The round's first `plan.pad` rows (shard order, cycling when the round is smaller) as one Parquet file at `out`
    (a temporary name, then renamed); None when no row is repeated (and an older pad file is removed)."""
    if not plan.pad:
        out.unlink(missing_ok=True)
        return None
    tables, need = [], plan.pad
    while need:
        for f in files:
            reader = pq.ParquetFile(f)
            if not reader.metadata.num_rows:
                continue
            first = next(reader.iter_batches(batch_size=min(need, reader.metadata.num_rows)))  # only the rows needed
            tables.append(pa.Table.from_batches([first]).replace_schema_metadata(reader.schema_arrow.metadata))
            need -= first.num_rows
            if not need:
                break
    joined = pa.concat_tables(tables, promote_options="default")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(joined, tmp)
    os.replace(tmp, out)
    return out


__all__ = ["BatchPlan", "PAD_FILE", "VERL_MINI_BATCH", "VERL_TRAIN_BATCH", "count_rows", "pad_path", "plan_batches", "write_pad"]
