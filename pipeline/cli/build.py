"""`mentor build`: a thin click command over stages.build."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from mentor.cli.options import parse_map
from mentor.pipeline.errors import ConfigError, config_error


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
    from mentor.pipeline.prompts import INSTRUCTIONS

    out = dict(INSTRUCTIONS)
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not DOMAIN=TEXT (e.g. 'math=Answer in \\boxed{{}}.', or 'math=' for none)", param_hint="--instruction")
        k, v = pair.split("=", 1)
        out[k.strip()] = v
    return out


@click.command()
@click.option("--base", required=True, metavar="SPEC",
              help="Base problems: gsm8k | math500 | humaneval (bundled), a Parquet/JSONL file or folder, or hf:NAME[:CONFIG]:SPLIT (locally cached).")
@click.option("--hints", "hints", multiple=True, metavar="PATH", help="Hints dataset(s) (repeatable). None: unhinted prompts only.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Shard folder: part-NNNNN.parquet, manifest.json, stats.json, README.md.")
@click.option("--mode", default="prefix", show_default=True, type=click.Choice(["prefix", "both"]),
              help="prefix: hinted problems get only the hinted prompt; both: the unhinted prompt is kept beside it.")
@click.option("--round", "round_", type=click.IntRange(0, 2**31 - 2),
              help="Round the prompts are for. Default: latest hint round + 1 (0 without hints).")
@click.option("--shard-rows", type=click.IntRange(1, 2**31 - 1), help="Rows per shard (default 100000).")
@click.option("--shard-bytes", type=click.IntRange(1024, 1 << 50), help="Target uncompressed bytes per shard (instead of --shard-rows).")
@click.option("--placement", type=click.Choice(["before", "after", "system", "assistant"]), default=None,
              help="Where the hint goes: before the problem, after it (just before the instruction), in the system message "
                   "(OpenRLHF, verl and TRL read each the same way), or as the start of the policy's answer (assistant: "
                   "needs --tokenizer; text prompts for OpenRLHF without its chat template and TRL, not verl) "
                   "[default: assistant with --tokenizer, else after].")
@click.option("--tokenizer", metavar="MODEL",
              help="The round's policy (CPU model name, folder or hub name): its chat template renders --placement "
                   "assistant, and stats/manifest record the longest prompt in its tokens (max_prompt_tokens).")
@click.option("--answer-template", metavar="NAME|TEXT",
              help="How the hint opens the answer (--placement assistant): bare, labelled, first_person, or a text with "
                   "{hint} [default: the measured best].")
@click.option("--template", "template_file", type=click.Path(exists=True, dir_okay=False),
              help="File with the hinted user message; placeholders {hint}, {problem}, optional {instruction} (instead of --placement).")
@click.option("--plain-template", "plain_template_file", type=click.Path(exists=True, dir_okay=False),
              help="File with the unhinted user message; placeholders {problem}, optional {instruction}.")
@click.option("--system", "system_prompt", help="System message placed before the user message.")
@click.option("--system-file", type=click.Path(exists=True, dir_okay=False), help="File with the system message.")
@click.option("--instruction", "instructions", multiple=True, metavar="DOMAIN=TEXT",
              help="Per-domain instruction appended to the user message (repeatable; 'math=' for none).")
@click.option("--status", "statuses", multiple=True, type=click.Choice(["accepted", "repaired", "fallback"]),
              help="Hint statuses to use (repeatable; default all three).")
@click.option("--seed", type=int, help="Shuffle rows with this seed (default: keep the base set's order).")
@click.option("--map", "maps", multiple=True, metavar="CANONICAL=COLUMN",
              help="Base-set column mapping, e.g. --map problem=question --map label=answer (repeatable).")
@click.option("--answer-after", metavar="MARKER",
              help="Label = the text after the last MARKER in the base label (e.g. '####' for raw GSM8K solutions).")
@click.option("--domain", default="math", show_default=True, type=click.Choice(["math", "code"]),
              help="Domain of base problems when the set has no domain column.")
@click.option("--strict", is_flag=True, help="Errors instead of counted warnings (unmatched hints, unusable base rows).")
def build(base, hints, out_dir, mode, round_, shard_rows, shard_bytes, placement, tokenizer, answer_template,
          template_file, plain_template_file, system_prompt, system_file, instructions, statuses, seed, maps, answer_after, domain, strict):
    """Build the next round's prompt shards (base problems + hints) for OpenRLHF, verl and TRL."""
    from pydantic import ValidationError

    from mentor.pipeline.stage import run_stage
    from mentor.stages import stage
    from mentor.stages.build import BuildConfig

    if system_prompt and system_file:
        raise ConfigError("give --system or --system-file, not both")
    kwargs: dict = {
        "base": base, "hints": list(hints), "mapping": parse_map(maps), "domain": domain, "answer_after": answer_after, "mode": mode,
        "round": round_, "system_prompt": system_prompt or _read_text(system_file, "--system-file"),
        "seed": seed, "shard_rows": shard_rows, "shard_bytes": shard_bytes, "strict": strict,
        "tokenizer": tokenizer, "answer_template": answer_template,
    }
    if placement and template_file:
        raise ConfigError("give --placement or --template, not both (a template places the hint itself)")
    if placement:
        kwargs["placement"] = placement
    if template_file:
        kwargs["template"] = _read_text(template_file, "--template")
    if plain_template_file:
        kwargs["plain_template"] = _read_text(plain_template_file, "--plain-template")
    if statuses:
        kwargs["hint_statuses"] = list(statuses)
    inst = _instructions(instructions)
    if inst is not None:
        kwargs["instructions"] = inst
    try:
        cfg = BuildConfig(**kwargs)
    except ValidationError as exc:
        raise config_error(exc, flags={"mapping": "--map", "hint_statuses": "--status", "instructions": "--instruction",
                                       "system_prompt": "--system", "answer_template": "--answer-template"}) from exc
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
