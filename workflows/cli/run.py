"""`mentor run`, `mentor status`, `mentor demo`: thin click commands over workflows.runner."""

from __future__ import annotations

import json
import logging
import os
from contextlib import nullcontext
from pathlib import Path

import click

from mentor.workflows.cli.options import executor_options
from mentor.pipeline.executor import dask_client
from mentor.pipeline.models import check_model
from mentor.stages import round_names, round_stages

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "run": "Run a round-by-round workflow (train -> ingest -> mine -> hint -> build); resumable.",
    "status": "Show a run directory's state per round and stage: done/running/interrupted/failed/pending, counts, errors.",
    "demo": "One round on the bundled real GSM8K rollouts with a CPU model (mentor run gsm8k-demo).",
}


class _RoundStageChoice(click.Choice):
    """One of the round stages, read from their declarations when asked (plugins included: MENTOR_PLUGIN_PATH)."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self):
        return round_names()

    @choices.setter
    def choices(self, value) -> None:  # (click.Choice.__init__ sets it)
        pass


STAGE_CHOICE = _RoundStageChoice()


def _run(workflow: str, run_dir: str | None, rounds: int | None, from_stage: str | None, only: str | None,
         force: bool, workers: int | None, scheduler: str | None, sample: int | None = None, model: str | None = None,
         scheduler_timeout: float = 30.0) -> Path:
    from mentor.workflows.config import load_workflow  # slow to import (the stages, polars): not for --help
    from mentor.workflows.runner import Runner, RunOptions  # likewise
    from mentor.stages.train import section_policy  # likewise

    wf = load_workflow(workflow)
    if sample is not None:
        wf.hint.sample = sample
    if model is not None:
        wf.hint.backend.model = model
        policy = section_policy(wf.trainer)  # a policy mentor samples itself (offline): its chat template renders the
        if policy is not None:  # next round's prompts too
            policy.model = model
    out = Path(run_dir) if run_dir else Path("runs") / wf.name
    click.echo(f"workflow {wf.name}: {wf.rounds if rounds is None else rounds} round(s) -> {out}", err=True)
    if workers is None and scheduler is None:
        ctx = nullcontext(None)
    else:
        # One hint engine per worker, each on tensor_parallel_size GPUs of its own.
        spec = wf.hint.backend.spec()
        ctx = dask_client(workers=workers, scheduler=scheduler, gpus_per_worker=spec.gpus, timeout=scheduler_timeout,
                          engines=spec.engine)
    with ctx as client:
        opts = RunOptions(rounds=rounds, from_stage=from_stage, only=only, force=force, client=client)
        runner = Runner(wf, out, opts)
        ran = runner.run()
    click.echo(f"ran {len(ran)} stage(s), skipped {len(runner.skipped)} already done", err=True)
    return out


@click.command()
@click.argument("workflow")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory (default runs/<name>).")
@click.option("--rounds", type=click.IntRange(1, 10_000), help="Number of rounds to run (default: the workflow's).")
@click.option("--from-stage", type=STAGE_CHOICE, help="Re-run this stage and every later one.")
@click.option("--only", type=STAGE_CHOICE, help="Run only this stage (its inputs must be done).")
@click.option("--force", is_flag=True, help="Re-run every stage even if done.")
@click.option("--sample", type=click.IntRange(1, 2**31 - 1), help="Hint only the first N collapsed problems (overrides hint.sample).")
@executor_options
def run(workflow, run_dir, rounds, from_stage, only, force, sample, workers, scheduler, scheduler_timeout):
    """Run a round-by-round workflow (train -> ingest -> mine -> hint -> build); resumable."""
    out = _run(workflow, run_dir, rounds, from_stage, only, force, workers, scheduler, sample,
               scheduler_timeout=scheduler_timeout)
    _print_status(out, "table")


@click.command()
@click.option("--run-dir", type=click.Path(file_okay=False), default="runs/gsm8k-demo", show_default=True, help="Run directory.")
@click.option("--sample", type=click.IntRange(1, 2**31 - 1), help="Collapsed problems to hint (default: the workflow's, 4).")
@click.option("--force", is_flag=True, help="Re-run every stage even if done.")
@click.option("--model", help="The hint model instead of the workflow's qwen2.5-coder-0.5b (prepared by `mentor setup-cpu "
                              "--model qwen2.5-coder-0.5b`), e.g. smollm2-135m: the embedded plumbing model, no download, "
                              "faster, its hints read as nonsense.")
def demo(run_dir, sample, force, model):
    """One round on the bundled real GSM8K rollouts with a CPU model (= mentor run gsm8k-demo).

    The terminal shows mentor's progress and summary; vLLM's and torch's own logging goes to RUN_DIR/engine.log
    (or $MENTOR_ENGINE_LOG), which the summary names; `mentor -v demo` shows it in the terminal instead."""
    from mentor.pipeline.llm import engine_to_terminal  # not for --help
    from mentor.workflows.config import load_workflow  # slow to import (the stages, polars): not for --help

    logging.getLogger("mentor").setLevel(logging.INFO)  # mentor's progress; the engine stays quiet unless -v
    # Before any work: a model that is not set up is a one-line error with the fix.
    check_model(model if model is not None else load_workflow("gsm8k-demo").hint.backend.model)
    engine_log = None if engine_to_terminal() else Path(os.environ.get("MENTOR_ENGINE_LOG") or Path(run_dir) / "engine.log")
    if engine_log is not None:
        engine_log.parent.mkdir(parents=True, exist_ok=True)
        os.environ["MENTOR_ENGINE_LOG"] = str(engine_log)
    out = _run("gsm8k-demo", run_dir, None, None, None, force, None, None, sample, model)
    _print_status(out, "table")
    from mentor.workflows.report import summarize_run  # polars: slow to import, not for --help
    from mentor.workflows.report_render import render_table  # likewise

    click.echo(render_table(summarize_run(out)))
    _show_a_hint(out)
    if engine_log is not None and engine_log.is_file():
        click.echo(f"vLLM's and torch's log: {engine_log} (`mentor -v demo` shows it in the terminal)")


def _show_a_hint(run_dir: Path) -> None:
    """The demo's last word: one hint the agents wrote (not the fallback), and the command that shows its trace."""
    import polars as pl  # slow to import: not for --help

    path = run_dir / "round-000" / "hints" / "hints.parquet"
    if not path.is_file():
        return
    hints = pl.read_parquet(path, columns=["problem_id", "status", "hint"])
    written = hints.filter(pl.col("status") != "fallback")
    row = (written if written.height else hints).row(0, named=True)
    click.echo("")
    if written.height:
        click.echo(f"{written.height} of {hints.height} hints written by the agents (the rest fell back); one of them "
                   f"({row['status']}, problem {row['problem_id']}):")
    else:
        click.echo(f"all {hints.height} hints fell back to the safe default; problem {row['problem_id']}'s:")
    click.echo(f"  {row['hint']}")
    click.echo(f"its trace (every model call and rule verdict): "
               f"mentor inspect {run_dir / 'round-000' / 'hints'} --problem {row['problem_id']}")
    prompts = sorted((run_dir / "round-000" / "prompts").glob("part-*.parquet"))
    sent = pl.read_parquet(prompts).filter(pl.col("problem_id") == row["problem_id"]) if prompts else None
    if sent is not None and sent.height and isinstance(sent["prompt"][0], str):  # placement assistant: rendered text
        click.echo("the next round's prompt for it, as the policy sees it (its chat template; the hint opens the answer):")
        click.echo("\n".join(f"  > {line}" for line in sent["prompt"][0].splitlines()))


def _print_status(run_dir: Path, fmt: str) -> None:
    from mentor.workflows.runner import run_status  # slow to import (the stages, polars): not for --help

    rows = run_status(run_dir)
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    stages = {st.name: st for st in round_stages()}  # the columns each stage declares, in round order
    cols = ["round", "stage", "state", *dict.fromkeys(c for st in stages.values() for c in st.status_columns), "error"]
    cols = [c for c in cols if any(r.get(c) is not None for r in rows)]
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in cols} if rows else {}
    click.echo("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        click.echo("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in cols))
    for r in rows:
        note = stages[r["stage"]].status_note(r) if r.get("stage") in stages else None
        if note:
            click.echo(note)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status(run_dir, fmt):
    """Per round and stage: done / running / interrupted / failed / pending, counts, last error."""
    _print_status(Path(run_dir), fmt)
