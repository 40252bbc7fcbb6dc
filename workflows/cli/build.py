"""`mentor build`: a thin click command over stages.build."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from mentor.workflows.cli.options import config_from_options, config_options, parse_map, parse_template_kwargs, template_kwargs_option
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.prompts import INSTRUCTIONS
from mentor.pipeline.schemas import HINT_STATUSES
from mentor.pipeline.stage import run_stage
from mentor.stages import stage
from mentor.stages.build import BuildConfig

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "build": "Build the next round's prompt shards (base problems + hints) for OpenRLHF, verl and TRL.",
}


def _read_text(path: str | None, option: str) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{option} {path}: cannot read it as UTF-8 text ({exc})") from exc


def _instructions(pairs: tuple[str, ...]) -> dict[str, str] | None:
    if not pairs:
        return None

    out = dict(INSTRUCTIONS)
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not DOMAIN=TEXT (e.g. 'math=Answer in \\boxed{{}}.', or 'math=' for none)", param_hint="--instruction")
        k, v = pair.split("=", 1)
        out[k.strip()] = v
    return out


BUILD_FLAGS = {"mapping": "--map", "hint_statuses": "--status", "instructions": "--instruction", "system_prompt": "--system",
               "chat_template_kwargs": "--chat-template-kwarg"}


@click.command()
@config_options(BuildConfig, ("base",), metavars={"base": "SPEC"})
@click.option("--hints", "hints", multiple=True, metavar="PATH", help="Hints dataset(s) (repeatable). None: unhinted prompts only.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Shard folder: part-NNNNN.parquet, manifest.json, stats.json, README.md.")
@config_options(BuildConfig, ("mode", "round", "shard_rows", "shard_bytes", "placement", "tokenizer", "answer_template"),
                metavars={"tokenizer": "MODEL", "answer_template": "NAME|TEXT"})
@template_kwargs_option
@click.option("--template", "template_file", type=click.Path(exists=True, dir_okay=False),
              help="File with the hinted user message; placeholders {hint}, {problem}, optional {instruction} (instead of --placement).")
@click.option("--plain-template", "plain_template_file", type=click.Path(exists=True, dir_okay=False),
              help="File with the unhinted user message; placeholders {problem}, optional {instruction}.")
@click.option("--system", "system_prompt", help="System message placed before the user message.")
@click.option("--system-file", type=click.Path(exists=True, dir_okay=False), help="File with the system message.")
@click.option("--instruction", "instructions", multiple=True, metavar="DOMAIN=TEXT",
              help="Per-domain instruction appended to the user message (repeatable; 'math=' for none).")
@click.option("--status", "statuses", multiple=True, type=click.Choice(list(HINT_STATUSES)),
              help="Hint statuses to use (repeatable; default all of them).")
@click.option("--map", "maps", multiple=True, metavar="CANONICAL=COLUMN",
              help="Base-set column mapping, e.g. --map problem=question --map label=answer (repeatable).")
@config_options(BuildConfig, ("seed", "answer_after", "domain", "strict"), metavars={"answer_after": "MARKER"})
def build(hints, out_dir, template_kwargs, template_file, plain_template_file, system_prompt, system_file, instructions,
          statuses, maps, **settings):
    """Build the next round's prompt shards (base problems + hints) for OpenRLHF, verl and TRL."""
    if system_prompt and system_file:
        raise ConfigError("give --system or --system-file, not both")
    if settings["placement"] and template_file:
        raise ConfigError("give --placement or --template, not both (a template places the hint itself)")
    if settings["answer_template"] is not None and template_file:
        raise click.UsageError("--answer-template applies to placement assistant (the hint opens the answer); --template "
                               "puts the hint in the user message: give one of them")
    kwargs: dict = settings | {"hints": list(hints), "mapping": parse_map(maps),
                               "system_prompt": system_prompt or _read_text(system_file, "--system-file")}
    if template_file:
        kwargs["template"] = _read_text(template_file, "--template")
    if plain_template_file:
        kwargs["plain_template"] = _read_text(plain_template_file, "--plain-template")
    if statuses:
        kwargs["hint_statuses"] = list(statuses)
    template_kw = parse_template_kwargs(template_kwargs)
    if template_kw is not None:
        kwargs["chat_template_kwargs"] = template_kw
    inst = _instructions(instructions)
    if inst is not None:
        kwargs["instructions"] = inst
    cfg = config_from_options(BuildConfig, kwargs, BUILD_FLAGS)
    templates = [Path(p) for p in (template_file, plain_template_file, system_file) if p]
    # The stage logs its warnings for library callers; the command prints them itself, once.
    stage_log = logging.getLogger("mentor.stages.build")
    level = stage_log.level
    stage_log.setLevel(max(level, logging.ERROR))
    try:
        stats = run_stage(stage("build"), {"template_files": templates}, cfg, out_dir)
    finally:
        stage_log.setLevel(level)
    for w in stats.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(json.dumps(stats.as_dict(), sort_keys=True))
