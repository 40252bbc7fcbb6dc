"""`mentor mine`: a thin click command over stages.mine (apart from ingest's module: `mentor mine` does not load the
trainers' log formats)."""

from __future__ import annotations

import json

import click

from mentor.pipeline.executor import open_executor
from mentor.pipeline.stage import Context, run_stage
from mentor.stages import stage
from mentor.stages.mine import MineConfig
from mentor.workflows.cli.options import config_from_options, config_options, executor_options

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "mine": "Find collapsed problems (every rollout wrong) with a few failed responses.",
}


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
