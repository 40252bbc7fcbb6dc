"""The `mentor` click group.

Commands live in small modules grouped by what a user does (``mentor.workflows.cli.ingest``,
``.mine``; ``.hint``: hint and its checks; ``.build``; ``.train``; ``.evaluate``:
rollout, rescue; ``.run``: workflows; ``.report``: inspect; ``.setup``: the
machine and servers; ``.stage``: any stage), thin layers over the stages. Each module
declares its commands in a top-level ``COMMANDS`` that `commands()` reads without
importing it; a module is imported only when one of its commands is invoked, so
``mentor --help`` stays fast and a user who only mines logs never imports an inference engine.
"""

from __future__ import annotations

import ast
import errno
import logging
import sys
import traceback

import click

from mentor.pipeline import plugins
from mentor.pipeline.errors import ConfigError, MentorError


def commands() -> dict[str, tuple[str, str]]:
    """Every command: name -> (its module's name in the folder, the one line ``mentor --help`` shows), by name.

    A module of this folder (or ``commands/<name>.py`` in a ``MENTOR_PLUGIN_PATH`` folder) adds the
    commands its top-level ``COMMANDS = {name: help line}`` declares (click commands of the module with
    those names); the others (``options``) are the commands' parts. Read without importing any module,
    so ``mentor --help`` stays fast: a new command is one new module, no list to edit.
    """
    found: dict[str, tuple[str, str]] = {}
    for member in plugins.names("commands"):
        value = plugins.declared("commands", member, "COMMANDS")
        if value is None:
            continue
        where = plugins.source("commands", member)
        try:
            declared = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            declared = None
        if not isinstance(declared, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and "\n" not in v
                                                     for k, v in declared.items()):
            raise ConfigError(f"{where}:{value.lineno}: COMMANDS must be a literal dict of command name -> one-line "
                              "help (strings); write it out as such")
        for name, help_line in declared.items():
            if name in found:
                other = plugins.source("commands", found[name][0])
                raise ConfigError(f"{where}: declares the command {name!r} that {other} declares; rename one of them")
            found[name] = (member, help_line)
    return dict(sorted(found.items()))


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(commands())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        found = commands()
        if name not in found:
            return None
        member = plugins.load("commands", found[name][0])
        for value in vars(member).values():
            if isinstance(value, click.Command) and value.name == name:
                return value
        raise ConfigError(f"{member.__file__}: COMMANDS declares {name!r} but the module has no click command "
                          f"of that name; add it (@click.command({name!r})) or remove it from COMMANDS")

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
        try:
            rows = [(name, help_line) for name, (_, help_line) in commands().items()]
        except MentorError as exc:  # a plugin's command module that does not parse: one line, not a traceback
            raise _one_line(ctx, exc, str(exc), exc.exit_code) from exc
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
