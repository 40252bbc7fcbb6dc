"""Build's writing: the rendered rows as ``part-NNNNN.parquet`` shards, and the dataset card.

Each shard is rendered from its slice of the rows and written with the plain
pyarrow writer (`io.write_parquet_atomic`: schema PROMPTS, zstd), so the same
rows give the same bytes. Shards are independent: a thread per core writes
them (polars and pyarrow release the GIL).
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from mentor.pipeline.io import to_table, write_parquet_atomic
from mentor.pipeline.prompts import render_prompt
from mentor.pipeline.schemas import SCHEMA_VERSION
from mentor.pipeline.stage import Stats
from mentor.stages.build_render import render_exprs
from mentor.pipeline.prompts import prompt_token_lengths

if TYPE_CHECKING:
    from mentor.stages.build import BuildConfig

DEFAULT_SHARD_ROWS = 100_000


def rows_per_shard(rows: pl.DataFrame, exprs: list[pl.Expr], cfg: BuildConfig) -> int:
    """--shard-rows, or --shard-bytes over the uncompressed Arrow size of a rendered sample's row."""
    if cfg.shard_bytes is None:
        return cfg.shard_rows or DEFAULT_SHARD_ROWS
    sample = rows.gather_every(max(1, rows.height // 1000)).select(exprs)
    per_row = max(1, to_table(sample, "prompts").nbytes // max(1, sample.height))
    return max(1, cfg.shard_bytes // per_row)


def write_shards(rows: pl.DataFrame, out_dir: Path, cfg: BuildConfig, round_: int, tokenizer: Any = None,
                 as_text: bool = False) -> tuple[list[Path], int | None]:
    """Render and write ``out_dir/part-NNNNN.parquet``; their paths in order, and the longest prompt in
    `tokenizer`'s tokens (None without one), both with ``cfg.chat_template_kwargs``. `as_text`: each prompt is
    rendered with the tokenizer's chat template (`prompts.render_prompt`) and written as text."""
    exprs = render_exprs(rows, cfg, round_)
    per = rows_per_shard(rows, exprs, cfg)
    starts = list(range(0, rows.height, per))
    lock = threading.Lock()  # a fast tokenizer may refuse two threads at once ("Already borrowed")

    def write(i: int) -> tuple[Path, int | None]:
        df = rows.slice(starts[i], per).select(exprs)
        longest = None
        if tokenizer is not None:
            prompts = df.get_column("prompt").to_list()
            with lock:
                if as_text:
                    prompts = [render_prompt(tokenizer, m, cfg.chat_template_kwargs) for m in prompts]
                longest = max(prompt_token_lengths(prompts, tokenizer, cfg.chat_template_kwargs), default=0)
            if as_text:
                df = df.with_columns(pl.Series("prompt", prompts, dtype=pl.String))
        return write_parquet_atomic(df, out_dir / f"part-{i:05d}.parquet", dataset="prompts"), longest

    with ThreadPoolExecutor(max_workers=max(1, min(len(starts), os.cpu_count() or 1))) as pool:
        done = list(pool.map(write, range(len(starts))))
    lengths = [n for _, n in done if n is not None]
    return [p for p, _ in done], (max(lengths, default=0) if tokenizer is not None else None)


def dataset_card(shards: list[str], stats: Stats, digests: list[str], text: bool = False) -> str:
    """README.md of the shard directory: its YAML `configs` make load_dataset(DIR) read only the shards.

    The config is named after the shards' content digest: `datasets` keys its
    cache of a directory on the card's configs (not on the files' mtimes), so a
    rebuild in place with other content must change it, or `load_dataset(DIR)`
    (what OpenRLHF calls) returns the rows of the earlier build.
    """
    digest = hashlib.sha256("".join(digests).encode()).hexdigest()[:16]
    return (
        "---\n"
        "configs:\n"
        f"- config_name: prompts-{digest}\n"
        "  default: true\n"
        "  data_files:\n"
        "  - split: train\n"
        "    path: part-*.parquet\n"
        "---\n"
        "# mentor prompt shards\n\n"
        f"{stats.rows} prompts ({stats.hinted_rows} hinted) for round {stats.round}, "
        f"schema `prompts` v{SCHEMA_VERSION}, in {len(shards)} shard(s) `part-NNNNN.parquet`.\n"
        "`manifest.json` lists each shard's rows and sha256; `stats.json` the build's counters.\n"
        f"Content digest: `{digest}`.\n\n"
        + (("`prompt` is text rendered with the policy's chat template (the hint opens the answer): give it to the "
             "trainer as it is.\n\n"
             "- OpenRLHF: `--data.prompt_dataset <this dir> --data.input_key prompt --data.label_key label` "
             "(without `--data.apply_chat_template`)\n"
             "- TRL: the `prompt` column as string prompts\n"
             "- verl 0.9.1: not readable (its agent loop applies the chat template to messages)\n")
            if text else
            ("- OpenRLHF: `--data.prompt_dataset <this dir> --data.input_key prompt --data.label_key label "
             "--data.apply_chat_template`\n"
             "- verl: `data.train_files` = the shard files\n")) +
        "- polars: `pl.scan_parquet('<this dir>/part-*.parquet')`\n"
    )


__all__ = ["DEFAULT_SHARD_ROWS", "dataset_card", "rows_per_shard", "write_shards"]
