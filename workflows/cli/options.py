"""Options and parameter types the commands share."""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Literal

import annotated_types
import click
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from mentor.pipeline import backends
from mentor.pipeline.errors import config_error
from mentor.pipeline.llm import BackendSettings


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also rejects nan and inf (nan passes every comparison)."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


def parse_map(pairs: tuple[str, ...]) -> dict[str, str]:
    """`--map canonical=source` pairs -> dict; a malformed pair is a usage error."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not canonical=column (e.g. correct=is_right)", param_hint="--map")
        k, v = pair.split("=", 1)
        out[k.strip()] = v.strip()
    return out


TEMPLATE_KWARG = "--chat-template-kwarg"


def template_kwargs_option(f):
    """--chat-template-kwarg KEY=VALUE (repeatable): a variable for the policy's chat template, as the trainer passes it."""
    return click.option(TEMPLATE_KWARG, "template_kwargs", multiple=True, metavar="KEY=VALUE",
                        help="A variable for the policy's chat template, the same the trainer passes (repeatable; the value "
                             "is read as YAML: enable_thinking=false for Qwen3's non-thinking mode). Default: the template's "
                             "own defaults.")(f)


def parse_template_kwargs(pairs: tuple[str, ...]) -> dict[str, Any] | None:
    """`--chat-template-kwarg KEY=VALUE` pairs -> dict (values read as YAML scalars); None when none is given."""
    if not pairs:
        return None
    import yaml  # a dependency of mentor (configs); imported on use

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE with a template variable name (e.g. enable_thinking=false)",
                                     param_hint=TEMPLATE_KWARG)
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise click.BadParameter(f"{pair!r}: the value is not YAML ({str(exc).splitlines()[0]})", param_hint=TEMPLATE_KWARG) from None
    return out


def executor_options(f):
    """--workers / --scheduler / --scheduler-timeout: where the stage's shard tasks run (`mentor.pipeline.executor.open_executor`)."""
    f = click.option("--scheduler-timeout", type=FiniteFloatRange(0, 86400, min_open=True), default=30.0, show_default=True,
                     metavar="SECONDS", help="With --scheduler: how long to wait for the scheduler to answer, and for its "
                                             "first worker.")(f)
    f = click.option("--scheduler", metavar="ADDRESS",
                     help="Run on an existing dask.distributed scheduler (tcp://HOST:8786) and its workers.")(f)
    f = click.option("--workers", type=click.IntRange(1, 4096),
                     help="Run on a local dask cluster of N engine worker processes (not with --scheduler).")(f)
    return f


class BackendChoice(click.Choice):
    """--backend's choices: the kinds of `mentor.pipeline.backends` (plugins included), read when asked.

    `server`: False leaves out the kinds that talk to a server (a command without the server's flags)."""

    def __init__(self, server: bool = True) -> None:
        super().__init__([])
        self.server = server

    @property
    def choices(self):  # click reads them at parse and --help time: a plugin folder set by then is in
        return tuple(n for n in backends.kinds() if self.server or not backends.kind(n).server)

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ sets them; they are derived instead
        pass


class BackendOption(click.Option):
    """--backend, whose help names each kind's own sentence (read at --help time, as the choices)."""

    def __init__(self, *args: Any, lead: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lead = lead

    def get_help_record(self, ctx):
        kinds = [backends.kind(n) for n in self.type.choices]
        self.help = f"{self.lead} " + "; ".join(f"{k.name}: {k.help}" for k in kinds) + "."
        return super().get_help_record(ctx)


def backend_option(lead: str = "The LLM backend.", server: bool = True):
    """--backend KIND, default the default kind; `server`: False refuses the kinds that need a server's flags."""
    def decorate(f):
        return click.option("--backend", cls=BackendOption, lead=lead, default=backends.DEFAULT, show_default=True,
                            type=BackendChoice(server))(f)

    return decorate


def server_options(f):
    """--base-url / --max-concurrency / --request-timeout / --structured-output: a backend that talks to a server."""
    f = click.option("--structured-output", type=click.Choice(["response_format", "structured_outputs", "none"]),
                     default="response_format", show_default=True,
                     help="A server backend: how JSON schemas reach the server (none: the server has no structured output).")(f)
    f = click.option("--request-timeout", type=FiniteFloatRange(0, 7 * 86400, min_open=True), default=backends.REQUEST_TIMEOUT,
                     show_default=True, metavar="SECONDS",
                     help="A server backend: how long a request may wait for the server's answer (not retried; a request "
                          "without one counts as a failed model call, and a server silent that long fails the stage).")(f)
    f = click.option("--max-concurrency", type=click.IntRange(1, 100_000), default=64, show_default=True,
                     help="A server backend: requests in flight at once.")(f)
    f = click.option("--base-url", metavar="URL", help="A server backend: the server, e.g. http://HOST:8000/v1 (key: $OPENAI_API_KEY).")(f)
    return f


# The vLLM engine's flags, declared once for every command that starts an engine: option -> (flag, type, help).
ENGINE_FLAGS: dict[str, tuple[str, Any, str]] = {
    "tensor_parallel_size": ("--tensor-parallel-size", click.IntRange(1, 1024), "vLLM: GPUs per engine [default: 1]."),
    "gpu_memory_utilization": ("--gpu-memory-utilization", FiniteFloatRange(0.0, 1.0, min_open=True),
                               "vLLM: share of GPU memory the engine may use."),
    "max_model_len": ("--max-model-len", click.IntRange(16, 1 << 24),
                      "vLLM: context length (default: the model's; 4096 for the CPU models; less memory on small machines)."),
    "dtype": ("--dtype", str, "vLLM: weights dtype (auto, bfloat16, float16, float32; auto is float32 on AVX2-only CPUs)."),
    "enforce_eager": ("--enforce-eager/--no-enforce-eager", bool, "vLLM: skip graph capture / compile (default on CPU: on)."),
}


def engine_options(*names: str):
    """click options for these vLLM engine settings (`ENGINE_FLAGS`); none has a default of its own (None: the engine's)."""
    def decorate(f):
        for name in reversed(names):
            flag, kind, help_ = ENGINE_FLAGS[name]
            extra = {} if kind is bool else {"type": kind}
            f = click.option(flag, name, default=None, help=help_, **extra)(f)
        return f

    return decorate


def engine_flags(values: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """What `backend_spec` takes as `engine`: each engine option among `values` as ``flag -> (option, value)``."""
    return {ENGINE_FLAGS[n][0].split("/")[0]: (n, values[n]) for n in ENGINE_FLAGS if n in values}


def backend_spec(backend: str, model: str | None, engine: dict[str, tuple[str, Any]] | None = None, *,
                 base_url: str | None = None, max_concurrency: int = 64, structured_output: str = "response_format",
                 request_timeout: float = backends.REQUEST_TIMEOUT, script: str | None = None):
    """The `BackendSpec` of a command's --backend/--model flags, built as every backend is (`BackendSettings`).

    `engine` maps the engine's flags to ``(option, value)`` (None: not given); the kind takes what is its own
    (`BackendKind.from_flags`: a server refuses engine flags, an engine refuses a named CPU model not set up,
    now, before any work). `script`: the command's canned answers, for a kind that takes them.
    """
    flags = {"engine": engine or {}, "base_url": base_url, "max_concurrency": max_concurrency,
             "structured_output": structured_output, "request_timeout": request_timeout, "script": script}
    options = backends.kind(backend).from_flags(model, flags)
    try:
        settings = BackendSettings(backend=backend, model=model, options=options)
    except ValidationError as exc:
        raise config_error(exc, flags=True) from exc
    return settings.spec()


# --------------------------------------------------------------------------- options from a stage's Config


def _bounds(metadata: list) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in metadata:
        for attr in ("ge", "gt", "le", "lt"):
            if isinstance(m, getattr(annotated_types, attr.capitalize())):
                out[attr] = getattr(m, attr)
    return out


def _click_type(annotation: Any, metadata: list) -> Any:
    """The click type of a field: a Literal's choices, a number's range (from ge/gt/le/lt), else the plain type."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # `X | None`: an option given or not
        (annotation,) = [a for a in args if a is not type(None)]
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return click.Choice([str(a) for a in args])
    b = _bounds(metadata)
    if annotation is int:
        lo = b.get("ge", b["gt"] + 1 if "gt" in b else None)
        hi = b.get("le", b["lt"] - 1 if "lt" in b else None)
        return click.IntRange(lo, hi) if b else int
    if annotation is float:
        return FiniteFloatRange(b.get("ge", b.get("gt")), b.get("le", b.get("lt")), min_open="gt" in b, max_open="lt" in b)
    return annotation if annotation in (str, bool) else str


def config_options(model: type[BaseModel], fields: tuple[str, ...], flags: dict[str, str] | None = None,
                   metavars: dict[str, str] | None = None, overrides: bool = False):
    """click options for `fields` of a stage's Config, declared once there: each option's flag (``k_failed`` ->
    ``--k-failed``, or `flags`), type and range, default and help come from the field; a bool is ``--x/--no-x``.

    `overrides`: the options override a config file (``--config``), so none has a default of its own (None:
    not given, the file's value stands); the help names the field's default."""
    flags, metavars = flags or {}, metavars or {}

    def decorate(f):
        for name in reversed(fields):
            info = model.model_fields[name]
            flag = flags.get(name, "--" + name.replace("_", "-"))
            default = None if info.default is PydanticUndefined else info.default
            kind = _click_type(info.annotation, info.metadata)
            help_ = info.description
            if overrides:
                help_ = f"{help_} Overrides --config's {name} (default {default})." if default is not None else help_
                default = None
            if kind is bool:
                decl = [f"{flag}/--no-{flag[2:]}", name]
                f = click.option(*decl, default=default, show_default=default is not None, help=help_)(f)
                continue
            f = click.option(flag, name, type=kind, default=default, show_default=default is not None,
                             required=info.is_required() and not overrides, metavar=metavars.get(name), help=help_)(f)
        return f

    return decorate


def config_from_options(model: type[BaseModel], values: dict[str, Any], flags: dict[str, str] | None = None) -> Any:
    """The Config from the options `config_options` made; an invalid value names its flag."""
    try:
        return model(**{k: v for k, v in values.items() if k in model.model_fields})
    except ValidationError as exc:
        raise config_error(exc, flags=flags or True) from exc
