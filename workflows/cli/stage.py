"""`mentor stage NAME`: run any stage (a built-in one or a plugin's) from its declaration.

The stage's ``Inputs`` and ``Config`` models are its options: ``--input KEY=VALUE`` and
``--set KEY=VALUE`` (repeatable; a VALUE is read as YAML, so ``3``, ``true`` and
``[a, b]`` are typed; an input the model declares as a list takes a single path too),
checked by the driver with the field's name. A stage added as one file in
``stages/`` (or ``<plugin folder>/stages/`` on ``MENTOR_PLUGIN_PATH``) runs here with no
command of its own; the built-in stages also have their own commands (``mentor mine``, ...).
"""

from __future__ import annotations

import json
import typing

import click
import yaml

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.executor import open_executor
from mentor.pipeline.stage import Context, run_stage
from mentor.stages import names, stage as stage_by_name
from mentor.workflows.cli.options import executor_options

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "stage": "Run any stage, built-in or a plugin's (MENTOR_PLUGIN_PATH), from its declaration: --input/--set KEY=VALUE.",
}


def _pairs(values: tuple[str, ...], flag: str) -> dict:
    out = {}
    for v in values:
        key, sep, raw = v.partition("=")
        if not sep or not key:
            raise click.UsageError(f"{flag} {v!r}: give KEY=VALUE")
        try:
            out[key] = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            out[key] = raw
    return out


def _listed(model, values: dict) -> dict:
    """A single value for a field the model declares as a list becomes a one-item list."""
    for key, value in values.items():
        field = model.model_fields.get(key)
        if field is not None and typing.get_origin(field.annotation) is list and not isinstance(value, list):
            values[key] = [value]
    return values


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("name")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="The stage's output folder.")
@click.option("--input", "inputs", multiple=True, metavar="KEY=VALUE", help="One of the stage's inputs (repeatable).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="One of the stage's settings (repeatable).")
@executor_options
def stage(name, out_dir, inputs, settings, workers, scheduler, scheduler_timeout):
    """Run the stage NAME (built-in or a plugin's) with its inputs and settings; print its stats."""
    known = names()
    if name not in known:
        raise click.BadParameter(f"{name!r}: no such stage (stages: {', '.join(known)})", param_hint="NAME")
    st = stage_by_name(name)
    if st.needs_engine:
        raise ConfigError(f"mentor stage {name}: the stage needs an LLM engine; run it through its own command "
                          "or a workflow (mentor run)")
    with open_executor(workers, scheduler, timeout=scheduler_timeout) as ex:
        stats = run_stage(st, _listed(st.Inputs, _pairs(inputs, "--input")),
                          _listed(st.Config, _pairs(settings, "--set")), out_dir, Context(executor=ex))
    click.echo(json.dumps(stats.as_dict(), sort_keys=True, default=str))
