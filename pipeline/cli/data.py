"""`mentor ingest` and `mentor mine`: thin click commands over stages.ingest / stages.mine."""

from __future__ import annotations

import json
import logging

import click

from mentor.cli.options import FiniteFloatRange, executor_options, parse_map
from mentor.pipeline.errors import config_error


@click.command()
@click.argument("sources", nargs=-1, required=True)
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(["auto", "canonical", "verl", "openrlhf", "gsm8k-example", "jsonl"]),
              help="Input format; auto sniffs it from the columns and says which it chose.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory for canonical rollout shards.")
@click.option("--round", "round_", type=click.IntRange(0, 2**31 - 1), help="Round number to stamp on the rollouts (default: from the log, else 0).")
@click.option("--domain", default="math", show_default=True, type=click.Choice(["math", "code"]), help="Domain when the log does not say.")
@click.option("--map", "maps", multiple=True, metavar="CANONICAL=COLUMN", help="Column mapping for --format jsonl (repeatable).")
@click.option("--problems", metavar="SPEC",
              help="Problems to fill the original problem text by problem_id: gsm8k | math500 | humaneval (bundled) or a problems Parquet file/folder.")
@click.option("--max-response-bytes", type=click.IntRange(1, 1 << 40), default=1 << 20, show_default=True,
              help="Longer responses are clipped (head and tail kept) and counted.")
def ingest(sources, fmt, out_dir, round_, domain, maps, problems, max_response_bytes):
    """Convert rollout logs into canonical rollout Parquet shards."""
    from mentor.pipeline.stage import run_stage
    from mentor.stages import stage

    cfg = {"format": fmt, "round": round_, "domain": domain, "mapping": parse_map(maps), "problems": problems,
           "max_response_bytes": max_response_bytes}
    # The stage logs its warnings for library callers; the command prints them itself, once.
    stage_log = logging.getLogger("mentor.stages.ingest")
    level = stage_log.level
    stage_log.setLevel(max(level, logging.ERROR))
    try:
        stats = run_stage(stage("ingest"), {"sources": list(sources)}, cfg, out_dir)
    finally:
        stage_log.setLevel(level)
    if fmt == "auto":
        click.echo(f"format: {stats.format} (auto-detected)", err=True)
    for w in stats.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(json.dumps(stats.as_dict(), sort_keys=True))


@click.command()
@click.argument("rollouts", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Writes DIR/collapsed.parquet and DIR/stats.json.")
@click.option("--correct-col", default="correct", show_default=True, help="Raw correctness column (never a shaped reward).")
@click.option("--threshold", type=FiniteFloatRange(0.0, 1.0, max_open=True), default=0.0, show_default=True,
              help="A rollout fails when correctness <= threshold.")
@click.option("--min-rollouts", type=click.IntRange(1, 2**31 - 1), default=2, show_default=True, help="Problems with fewer valid rollouts are not judged.")
@click.option("--k-failed", type=click.IntRange(0, 10_000), default=2, show_default=True, help="Failed responses kept per collapsed problem (deduplicated).")
@click.option("--failed-budget", "failed_budget_chars", type=click.IntRange(64, 2**31 - 1), default=2000, show_default=True,
              help="Characters kept per failed response (mostly its end).")
@click.option("--history", multiple=True, metavar="PATH", help="Earlier rounds' collapsed.parquet / hints.parquet (fills streak, previous_hints).")
@click.option("--solutions", metavar="PATH", help="Reference solutions to carry into the collapsed set (Parquet/JSONL with "
              "problem_id and solution) [default: the bundled GSM8K, MATH-500 and HumanEval solutions].")
@executor_options
def mine(rollouts, out_dir, correct_col, threshold, min_rollouts, k_failed, failed_budget_chars, history, solutions, workers,
         scheduler, scheduler_timeout):
    """Find collapsed problems (every rollout wrong) with a few failed responses."""
    from pydantic import ValidationError

    from mentor.pipeline.executor import open_executor
    from mentor.pipeline.stage import Context, run_stage
    from mentor.stages import stage
    from mentor.stages.mine import MineConfig

    try:
        cfg = MineConfig(correct_col=correct_col, threshold=threshold, min_rollouts=min_rollouts,
                         k_failed=k_failed, failed_budget_chars=failed_budget_chars, solutions=solutions)
    except ValidationError as exc:
        raise config_error(exc, flags={"failed_budget_chars": "--failed-budget"}) from exc
    with open_executor(workers, scheduler, timeout=scheduler_timeout) as executor:
        stats = run_stage(stage("mine"), {"sources": list(rollouts), "history": list(history)}, cfg, out_dir,
                          Context(executor=executor))
    click.echo(json.dumps(stats.as_dict(), sort_keys=True))
