"""`mentor ingest`: a thin click command over stages.ingest."""

from __future__ import annotations

import json
import logging

import click

from mentor.pipeline.stage import run_stage
from mentor.stages import stage
from mentor.stages.ingest import IngestConfig
from mentor.workflows.cli.options import config_from_options, config_options, parse_map

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "ingest": "Convert rollout logs (canonical, verl, openrlhf, gsm8k-example, jsonl) into canonical rollout shards.",
}


@click.command()
@click.argument("sources", nargs=-1, required=True)
@config_options(IngestConfig, ("format",))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory for canonical rollout shards.")
@config_options(IngestConfig, ("round", "domain"))
@click.option("--map", "maps", multiple=True, metavar="CANONICAL=COLUMN", help="Column mapping for --format jsonl (repeatable).")
@config_options(IngestConfig, ("problems", "max_response_bytes"), metavars={"problems": "SPEC"})
def ingest(sources, out_dir, maps, **settings):
    """Convert rollout logs into canonical rollout Parquet shards."""
    cfg = config_from_options(IngestConfig, settings | {"mapping": parse_map(maps)})
    # The stage logs its warnings for library callers; the command prints them itself, once.
    stage_log = logging.getLogger("mentor.stages.ingest")
    level = stage_log.level
    stage_log.setLevel(max(level, logging.ERROR))
    try:
        stats = run_stage(stage("ingest"), {"sources": list(sources)}, cfg, out_dir)
    finally:
        stage_log.setLevel(level)
    if cfg.format == "auto":
        click.echo(f"format: {stats.format} (auto-detected)", err=True)
    for w in stats.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(json.dumps(stats.as_dict(), sort_keys=True))
