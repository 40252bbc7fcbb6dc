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
