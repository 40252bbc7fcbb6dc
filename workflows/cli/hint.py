"""Hinting: `mentor hint`, `mentor check-hint`, `mentor check-judge` — thin click commands over stages.hint."""

from __future__ import annotations

import json
import sys

import click

from mentor.workflows.cli.options import (backend_option, backend_spec, config_options, engine_flags, engine_options, executor_options,
                                server_options)
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.executor import open_executor
from mentor.pipeline.outdir import check_output_file
from mentor.pipeline.stage import Context, run_stage
from mentor.stages import stage
from mentor.stages.hint.config import HintConfig, JudgeCheckConfig, load_config
from mentor.stages.hint.judge_check import check_judge_path, stats_view, summary_line
from mentor.stages.rules import RuleLimits, check, control_tokens, control_tokens_in  # plain Python: defaults show in --help

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "hint": "Hint collapsed problems with four LLM agents on vLLM (attribution, generation, judgment, repair).",
    "check-hint": "Run the hint rules (answer leak, full solution, ...) on one hint; exit 1 when it fails.",
    "check-judge": "Score the LLM judge on known-good and known-bad hints; exit 1 when it cannot tell them apart.",
}


@click.command()
@click.argument("collapsed", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Writes DIR/hints.parquet and DIR/stats.json (shards under DIR/_shards).")
@backend_option("The hint agents' model.")
@click.option("--model", help="Model path or Hugging Face name for an engine (default: the embedded SmolLM2-135M demo model); "
                              "with a server backend, the name the server serves.")
@server_options
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="hint.yaml with HintConfig fields (top level or under `hint:`).")
@click.option("--sample", type=click.IntRange(1, 2**31 - 1), help="Hint only the first N collapsed problems (problem_id order), for demos.")
@config_options(HintConfig, ("seed", "templates_dir", "shard_size"), flags={"templates_dir": "--templates"},
                metavars={"templates_dir": "DIR"}, overrides=True)
@engine_options("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "dtype", "enforce_eager")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@executor_options
def hint(collapsed, out_dir, backend, model, base_url, max_concurrency, request_timeout, structured_output, config_path, sample, seed,
         templates_dir, shard_size, progress, workers, scheduler, scheduler_timeout, **engine):
    """Hint collapsed problems with four LLM agents (attribution, generation, judgment, repair)."""
    cfg = load_config(config_path, seed=seed, templates_dir=templates_dir, shard_size=shard_size)
    if cfg.vouch is not None:  # the policy's settings, before the judge check and the first shard
        cfg.vouch.policy.check(f"{config_path}: vouch.policy")
    spec = backend_spec(backend, model, engine_flags(engine), base_url=base_url, max_concurrency=max_concurrency,
                        structured_output=structured_output, request_timeout=request_timeout,
                        script="mentor.stages.hint.agents:fake_script")
    with open_executor(workers, scheduler, gpus_per_worker=engine["tensor_parallel_size"] or 1, timeout=scheduler_timeout,
                       engines=spec.engine) as executor:
        stats = run_stage(stage("hint"), {"collapsed": list(collapsed), "sample": sample}, cfg, out_dir,
                          Context(executor=executor, backend=spec, progress=progress))
    click.echo(json.dumps(stats.as_dict(), sort_keys=True))


@click.command("check-hint")
@click.argument("hint_text", metavar="HINT")
@click.option("--domain", default="math", show_default=True, type=click.Choice(["math", "code"]), help="Problem domain.")
@click.option("--answer", help="Reference answer (math), or the code label JSON / entry point name (code).")
@click.option("--problem", default="", help="The problem text (enables the restatement check).")
@click.option("--entry-point", help="Code: the function a hint must not define.")
@click.option("--previous", multiple=True, help="An earlier round's hint (repeatable): identical hints are rejected.")
@click.option("--max-chars", type=click.IntRange(1, 2**31 - 1), default=RuleLimits.max_chars, show_default=True,
              help="Longest acceptable hint (the hint stage's default).")
@click.option("--max-sentences", type=click.IntRange(1, 2**31 - 1), default=RuleLimits.max_sentences, show_default=True,
              help="Most sentences in a hint (the hint stage's default).")
@click.option("--tokenizer", multiple=True, metavar="MODEL",
              help="The policy's (or the hint engine's) tokenizer, a mentor CPU model name, folder or hub name "
                   "(repeatable): its special and added tokens count as chat-control tokens too (rule special_token; "
                   "always checked: the common chat templates' tokens).")
def check_hint(hint_text, domain, answer, problem, entry_point, previous, max_chars, max_sentences, tokenizer):
    """Run the hint rules alone; print {"ok", "violations"} (and "special_tokens" found); exit 0 when ok, 1 when not."""
    if domain == "math" and not answer:
        raise ConfigError("--answer is required for --domain math (the reference answer the hint must not reveal)")
    if tokenizer:
        from mentor.pipeline.prompts import load_tokenizer  # transformers: only when asked for

        tokens = control_tokens(*(load_tokenizer(t) for t in tokenizer))
    else:
        tokens = control_tokens()
    report = check(hint_text, domain=domain, answer=answer, problem=problem, previous_hints=previous,
                   entry_point=entry_point, limits=RuleLimits(max_chars=max_chars, max_sentences=max_sentences),
                   control_tokens=tokens)
    out = report.as_dict()
    found = control_tokens_in(hint_text, tokens)
    if found:
        out["special_tokens"] = found
    click.echo(json.dumps(out, ensure_ascii=False))
    sys.exit(0 if report.ok else 1)


@click.command("check-judge")
@click.argument("collapsed", nargs=-1, required=True)
@backend_option("The judge's model.", server=False)
@click.option("--model", help="The judge's model, as `mentor hint --model` (default: the embedded SmolLM2-135M).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="hint.yaml (HintConfig: the judge's settings and judge_check).")
@config_options(JudgeCheckConfig, ("problems", "solutions"), metavars={"solutions": "FILE"}, overrides=True)
@click.option("--out", "out_file", type=click.Path(dir_okay=False), help="Also write the report with every verdict and the judge's raw text (JSON).")
@engine_options("max_model_len", "dtype", "tensor_parallel_size")
def check_judge(collapsed, backend, model, config_path, problems, solutions, out_file, **engine):
    """Score the LLM judge on known-good and known-bad hints of these problems; exit 0 when it can be trusted, 1 when not."""
    if out_file is not None:
        check_output_file(out_file)  # before the judge's engine starts, not when the report is written
    cfg = load_config(config_path)
    jc = cfg.judge_check.model_copy(update={k: v for k, v in {"problems": problems, "solutions": solutions}.items() if v is not None})
    cfg = cfg.model_copy(update={"judge_check": jc})
    spec = backend_spec(backend, model, engine_flags(engine), script="mentor.stages.hint.agents:fake_script")
    report = check_judge_path(list(collapsed), cfg, spec, out=out_file)
    click.echo(summary_line(report, run=False), err=True)
    click.echo(json.dumps(stats_view(report), sort_keys=True))
    sys.exit(0 if report["status"] == "trusted" else 1)
