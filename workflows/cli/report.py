"""`mentor inspect`: the report on a stage's outputs or a run directory (workflows.report)."""

from __future__ import annotations

import click

from mentor.workflows.report import inspect_path, problem_history
from mentor.workflows.report_render import plot, render_table, to_json

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "inspect": "Summarise rollouts, collapsed, hints, prompts, rescue outputs or a run directory.",
}


@click.command()
@click.argument("path", type=click.Path())
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(["table", "json"]),
              help="table: readable on a terminal; json: one valid JSON document.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False), metavar="OUT.png",
              help="Also write a PNG of collapse rate and hint status per round (run directory or rollouts).")
@click.option("--problem", "problem_id", metavar="ID", help="Show one problem's history across rounds instead of the summary.")
def inspect(path, fmt, plot_out, problem_id):
    """Summarise rollouts, collapsed, hints, prompts, rescue outputs or a whole run directory."""
    if problem_id is not None:
        result = problem_history(path, problem_id)
        title = f"problem {problem_id} in {path}"
    else:
        result = inspect_path(path)
        title = f"{result['kind']}: {path}"
    if plot_out:
        summary = result if problem_id is None else inspect_path(path)
        plot(summary, plot_out)
        click.echo(f"plot: {plot_out}", err=True)
    if fmt == "json":
        click.echo(to_json(result))
    else:
        click.echo(render_table(result, title=title))
