"""`mentor ingest` and `mentor mine`: thin click commands over stages.ingest / stages.mine."""

from __future__ import annotations

import json
import logging

import click

from mentor.workflows.cli.options import config_from_options, config_options, executor_options, parse_map
from mentor.pipeline.executor import open_executor
from mentor.pipeline.stage import Context, run_stage
from mentor.stages import stage
from mentor.stages.ingest import IngestConfig
from mentor.stages.mine import MineConfig

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "ingest": "Convert rollout logs (canonical, verl, openrlhf, gsm8k-example, jsonl) into canonical rollout shards.",
    "mine": "Find collapsed problems (every rollout wrong) with a few failed responses.",
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


MINE_FLAGS = {"failed_budget_chars": "--failed-budget"}


@click.command()
@click.argument("rollouts", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Writes DIR/collapsed.parquet, DIR/cut.jsonl and DIR/stats.json.")
@config_options(MineConfig, ("correct_col", "threshold", "min_rollouts", "k_failed", "failed_budget_chars", "cut_share", "solutions"),
                flags=MINE_FLAGS, metavars={"solutions": "PATH"})
@click.option("--history", multiple=True, metavar="PATH", help="Earlier rounds' collapsed.parquet / hints.parquet (fills streak, previous_hints).")
@executor_options
def mine(rollouts, out_dir, history, workers, scheduler, scheduler_timeout, **settings):
    """Find collapsed problems (every rollout wrong) with a few failed responses."""
    cfg = config_from_options(MineConfig, settings, MINE_FLAGS)
    with open_executor(workers, scheduler, timeout=scheduler_timeout) as executor:
        stats = run_stage(stage("mine"), {"sources": list(rollouts), "history": list(history)}, cfg, out_dir,
                          Context(executor=executor))
    click.echo(json.dumps(stats.as_dict(), sort_keys=True))
