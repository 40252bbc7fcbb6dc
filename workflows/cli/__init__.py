"""The `mentor` click group.

Commands live in small modules grouped by what a user does (``mentor.workflows.cli.data``:
ingest, mine; ``.hint``: hint and its checks; ``.build``; ``.train``; ``.evaluate``:
rollout, rescue; ``.run``: workflows; ``.report``: inspect; ``.setup``: the
machine and servers), thin layers over the stages, imported only
when invoked, so ``mentor --help`` stays fast and a user who only mines logs
never imports an inference engine.
"""

from __future__ import annotations

import errno
import importlib
import logging
import sys
import traceback

import click

from mentor.pipeline.errors import MentorError

# name -> (module, attribute, one-line help). Keep the help in step with the command.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "ingest": ("mentor.workflows.cli.data", "ingest", "Convert rollout logs (canonical, verl, openrlhf, gsm8k-example, jsonl) into canonical rollout shards."),
    "mine": ("mentor.workflows.cli.data", "mine", "Find collapsed problems (every rollout wrong) with a few failed responses."),
    "hint": ("mentor.workflows.cli.hint", "hint", "Hint collapsed problems with four LLM agents on vLLM (attribution, generation, judgment, repair)."),
    "check-hint": ("mentor.workflows.cli.hint", "check_hint", "Run the hint rules (answer leak, full solution, ...) on one hint; exit 1 when it fails."),
    "check-judge": ("mentor.workflows.cli.hint", "check_judge", "Score the LLM judge on known-good and known-bad hints; exit 1 when it cannot tell them apart."),
    "serve": ("mentor.workflows.cli.setup", "serve", "Start `vllm serve` for a model with mentor's engine settings (an OpenAI-compatible server for --backend openai)."),
    "doctor": ("mentor.workflows.cli.setup", "doctor", "Check this node before the first round: driver/CUDA/torch, GPUs, vLLM, the hint model, reward files, Ray, disk."),
    "setup-cpu": ("mentor.workflows.cli.setup", "setup_cpu", "Prepare a CPU machine for vLLM and convert the embedded SmolLM2 demo model."),
    "setup-sandbox": ("mentor.workflows.cli.setup", "setup_sandbox", "Install bubblewrap (apt) where possible and print the code sandbox's layers."),
    "train": ("mentor.workflows.cli.train", "train", "Run one GRPO round (OpenRLHF, verl or TRL) from round.yaml (--dry-run prints the command)."),
    "rollout": ("mentor.workflows.cli.evaluate", "rollout", "Sample k responses per prompt with vLLM, verify them, write canonical rollouts."),
    "rescue": ("mentor.workflows.cli.evaluate", "rescue", "Re-roll collapsed problems with and without their hints; report the rescue rate."),
    "build": ("mentor.workflows.cli.build", "build", "Build the next round's prompt shards (base problems + hints) for OpenRLHF, verl and TRL."),
    "run": ("mentor.workflows.cli.run", "run", "Run a round-by-round workflow (train -> ingest -> mine -> hint -> build); resumable."),
    "status": ("mentor.workflows.cli.run", "status", "Show a run directory's state per round and stage: done/running/interrupted/failed/pending, counts, errors."),
    "demo": ("mentor.workflows.cli.run", "demo", "One round on the bundled real GSM8K rollouts with a CPU model (mentor run gsm8k-demo)."),
    "stage": ("mentor.workflows.cli.stage", "stage", "Run any stage, built-in or a plugin's (MENTOR_PLUGIN_PATH), from its declaration: --input/--set KEY=VALUE."),
    "inspect": ("mentor.workflows.cli.report", "inspect", "Summarise rollouts, collapsed, hints, prompts, rescue outputs or a run directory."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context):
        args = [*ctx._protected_args, *ctx.args]  # the subcommand's, to name its output folder in disk errors
        try:
            return super().invoke(ctx)
        except MentorError as exc:
            raise _one_line(ctx, exc, str(exc), exc.exit_code) from exc
        except OSError as exc:
            if isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE:
                # The reader went away (`mentor status RUN | head`): not a disk problem. click's main() ends quietly.
                raise
            # A disk or permission problem (out of space, read-only folder, ...): the user's to fix.
            from mentor.pipeline.outdir import disk_error

            where = exc.filename or self._output_of(ctx, args) or "writing the outputs"
            raise _one_line(ctx, exc, str(disk_error(exc, where)), 1) from exc
        except RecursionError as exc:
            raise _one_line(ctx, exc, "the input is nested too deeply to read (RecursionError); "
                            "flatten the nested values (JSON/YAML deeper than a few hundred levels)", 1) from exc
        except MemoryError as exc:
            raise _one_line(ctx, exc, "out of memory; process the input in smaller parts "
                            "(fewer or smaller files, or --workers on a cluster)", 1) from exc

    def _output_of(self, ctx: click.Context, args: list[str]) -> str | None:
        """The output folder the failed command was given (--out / --run-dir), if any."""
        try:
            name, cmd, rest = self.resolve_command(ctx, list(args))
            sub = cmd.make_context(name, rest, parent=ctx, resilient_parsing=True)
        except Exception:  # only a better message is at stake
            return None
        value = sub.params.get("out_dir") or sub.params.get("run_dir")
        return str(value) if value else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # One line per command without importing any of them.
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _one_line(ctx: click.Context, exc: BaseException, message: str, exit_code: int) -> click.ClickException:
    """The click error for `exc`: one line (the first of `message`); with `mentor -v`, the traceback first."""
    if ctx.params.get("verbose"):
        traceback.print_exception(exc, file=sys.stderr)
    err = click.ClickException(message)
    err.exit_code = exit_code
    return err


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mentor")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """mentor: turn collapsed GRPO problems into answer-free hints between training rounds.

    The loop: mine the round's rollouts for collapsed problems -> hint them with
    four LLM agents (vLLM) -> build the next epoch's prompt shards -> train.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def main() -> None:
    """Console entry point. Domain errors are one-line `Error: ...` with exit 1 (data) or 2 (usage/config)."""
    cli()
