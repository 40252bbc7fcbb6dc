"""Options and parameter types the commands share."""

from __future__ import annotations

import math

import click


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
    """--workers / --scheduler: where the stage's shard tasks run (`mentor.pipeline.executor.open_executor`)."""
    f = click.option("--scheduler", metavar="ADDRESS", help="Run on an existing dask.distributed scheduler.")(f)
    f = click.option("--workers", type=click.IntRange(1, 4096), help="Run on a dask LocalCluster with N worker processes.")(f)
    return f


def server_options(f):
    """--base-url / --max-concurrency / --structured-output: the `openai` backend (an OpenAI-compatible server)."""
    f = click.option("--structured-output", type=click.Choice(["response_format", "structured_outputs", "none"]),
                     default="response_format", show_default=True,
                     help="openai backend: how JSON schemas reach the server (none: the server has no structured output).")(f)
    f = click.option("--max-concurrency", type=click.IntRange(1, 100_000), default=64, show_default=True,
                     help="openai backend: requests in flight at once.")(f)
    f = click.option("--base-url", metavar="URL", help="openai backend: the server, e.g. http://HOST:8000/v1 (key: $OPENAI_API_KEY).")(f)
    return f


def server_backend_options(model: str | None, base_url: str | None, max_concurrency: int, structured_output: str,
                           engine_flags: dict | None = None) -> dict:
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
    return {"base_url": base_url, "max_concurrency": max_concurrency, "structured_output": structured_output}
