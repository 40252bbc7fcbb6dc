"""Options and parameter types the commands share."""

from __future__ import annotations

import math

import click

from mentor.pipeline.openai_backend import DEFAULT_TIMEOUT, check_base_url


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


def server_options(f):
    """--base-url / --max-concurrency / --request-timeout / --structured-output: the `openai` backend (a server)."""
    f = click.option("--structured-output", type=click.Choice(["response_format", "structured_outputs", "none"]),
                     default="response_format", show_default=True,
                     help="openai backend: how JSON schemas reach the server (none: the server has no structured output).")(f)
    f = click.option("--request-timeout", type=FiniteFloatRange(0, 7 * 86400, min_open=True), default=DEFAULT_TIMEOUT,
                     show_default=True, metavar="SECONDS",
                     help="openai backend: how long one attempt of a request may wait for the server's answer (the "
                          "client retries 4 times; a request that still has no answer counts as a failed model call).")(f)
    f = click.option("--max-concurrency", type=click.IntRange(1, 100_000), default=64, show_default=True,
                     help="openai backend: requests in flight at once.")(f)
    f = click.option("--base-url", metavar="URL", help="openai backend: the server, e.g. http://HOST:8000/v1 (key: $OPENAI_API_KEY).")(f)
    return f


def server_backend_options(model: str | None, base_url: str | None, max_concurrency: int, structured_output: str,
                           engine_flags: dict | None = None, request_timeout: float = DEFAULT_TIMEOUT) -> dict:
    """The `openai` backend's options from the command line; engine flags are the server's, not ours."""
    from mentor.pipeline.errors import ConfigError

    if not base_url:
        raise click.BadParameter("--backend openai needs the server's URL, e.g. --base-url http://localhost:8000/v1",
                                 param_hint="--base-url")
    if not model:
        raise click.BadParameter("--backend openai needs the name the server serves (GET BASE_URL/models lists them)",
                                 param_hint="--model")
    given = [flag for flag, v in (engine_flags or {}).items() if v is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: engine settings of a server are set where it is started (vllm serve ...), "
                          "not by mentor; drop them with --backend openai")
    return {"base_url": check_base_url(base_url, "--base-url"), "max_concurrency": max_concurrency,
            "structured_output": structured_output, "timeout": request_timeout}
