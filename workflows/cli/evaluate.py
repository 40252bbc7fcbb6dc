"""Sampling the policy: `mentor rollout` (k verified responses per prompt) and `mentor rescue` (re-rolls of
collapsed problems with and without hints) — thin click commands over stages.rollout / stages.rescue."""

from __future__ import annotations

import json
import sys

import click

from mentor.workflows.cli.options import (backend_option, backend_spec, config_from_options, config_options, engine_flags, engine_options,
                                parse_template_kwargs, server_options, template_kwargs_option)
from mentor.pipeline.stage import Context, run_stage
from mentor.stages import stage
from mentor.stages.rollout import RolloutConfig

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "rollout": "Sample k responses per prompt with vLLM, verify them, write canonical rollouts.",
    "rescue": "Re-roll collapsed problems with and without their hints; report the rescue rate.",
}

SAMPLING = ("shard_size", "k", "max_tokens", "temperature", "top_p", "seed", "limit", "round")


def _policy_options(f):
    f = server_options(f)
    f = backend_option("The policy (with a server backend, --policy is the name it serves).")(f)
    f = click.option("--policy", "policy", default=None, metavar="MODEL",
                     help="Policy model: a folder, an HF name, or a CPU model name from `mentor setup-cpu --model` "
                          "(qwen2.5-coder-0.5b, qwen2.5-coder-1.5b); default: the embedded demo model.")(f)
    f = config_options(RolloutConfig, SAMPLING)(f)
    f = template_kwargs_option(f)
    f = engine_options("max_model_len", "tensor_parallel_size")(f)
    f = click.option("--progress/--no-progress", default=None,
                     help="A progress bar of rollouts on stderr, moved as each rollout finishes [default: on when stderr is a terminal].")(f)
    return f


def _sampling(settings: dict, template_kwargs: tuple[str, ...]) -> RolloutConfig:
    kw = parse_template_kwargs(template_kwargs)
    return config_from_options(RolloutConfig, settings | ({"chat_template_kwargs": kw} if kw is not None else {}),
                               {"chat_template_kwargs": "--chat-template-kwarg"})


def _progress(flag: bool | None) -> bool:
    return sys.stderr.isatty() if flag is None else flag


def _backend(backend, policy, max_model_len, tensor_parallel_size, base_url, max_concurrency, structured_output,
             request_timeout):
    """A BackendSpec: the engine starts only once the inputs have been read and a shard needs sampling."""
    engine = engine_flags({"max_model_len": max_model_len,
                           "tensor_parallel_size": tensor_parallel_size})
    return backend_spec(backend, policy, engine, base_url=base_url, max_concurrency=max_concurrency,
                        structured_output=structured_output, request_timeout=request_timeout)


@click.command()
@click.argument("prompts", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Writes DIR/part-NNNNN.parquet (rollouts, one per shard) and DIR/stats.json.")
@_policy_options
def rollout(prompts, out_dir, backend, base_url, max_concurrency, request_timeout, structured_output, policy, max_model_len,
            tensor_parallel_size, progress, template_kwargs, **settings):
    """Sample k responses per prompt (vLLM offline), verify them, write canonical rollouts.

    PROMPTS: prompt shards from `mentor build`, a problems dataset, or a bundled set (gsm8k, math500, humaneval).
    """
    cfg = _sampling(settings, template_kwargs)
    spec = _backend(backend, policy, max_model_len, tensor_parallel_size, base_url, max_concurrency, structured_output,
                    request_timeout)
    _print(run_stage(stage("rollout"), {"prompts": list(prompts)}, cfg, out_dir, Context(backend=spec, progress=_progress(progress))))


def _print(stats) -> None:
    """The stage's stats on stdout, one JSON line, without the config (the user just gave it)."""
    out = stats.as_dict()
    out.pop("config", None)
    click.echo(json.dumps(out, sort_keys=True))


def _arms(hints: tuple[str, ...], arms: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"hinted": list(hints)} if hints else {}
    for spec in arms:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"{spec!r} is not NAME=HINTS (e.g. full=runs/x/hints/hints.parquet)", param_hint="--arm")
        out.setdefault(name.strip(), []).append(path.strip())
    if not out:
        raise click.UsageError("give the hints to test: --hints HINTS (the arm 'hinted') or --arm NAME=HINTS (repeatable)")
    return out


@click.command()
@click.option("--collapsed", "collapsed", multiple=True, required=True,
              help="collapsed.parquet from `mentor mine` (repeatable), or a problems dataset / bundled set name.")
@click.option("--hints", "hints", multiple=True, help="hints.parquet from `mentor hint` (repeatable): the arm 'hinted'.")
@click.option("--arm", "arms", multiple=True, metavar="NAME=HINTS",
              help="A named arm of hints (repeatable), e.g. --arm full=a/hints.parquet --arm generic=b/hints.parquet.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Writes DIR/rescue.parquet, DIR/stats.json, DIR/rollouts/.")
@config_options(RolloutConfig, ("placement", "tokenizer", "answer_template"),
                metavars={"tokenizer": "MODEL", "answer_template": "NAME|TEXT"})
@_policy_options
def rescue(collapsed, hints, arms, out_dir, backend, base_url, max_concurrency, request_timeout, structured_output, policy,
           max_model_len, tensor_parallel_size, progress, template_kwargs, **settings):
    """Re-roll collapsed problems without a hint and under each arm of hints; report each arm's rescue rate.

    Every arm re-rolls the same problems (those with a hint in every arm) with the same seeds.
    """
    cfg = _sampling(settings, template_kwargs)
    inputs = {"collapsed": list(collapsed), "arms": _arms(hints, arms)}
    spec = _backend(backend, policy, max_model_len, tensor_parallel_size, base_url, max_concurrency, structured_output,
                    request_timeout)
    _print(run_stage(stage("rescue"), inputs, cfg, out_dir, Context(backend=spec, progress=_progress(progress))))
