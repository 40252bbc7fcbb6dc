"""Error taxonomy.

`ConfigError` is a usage/configuration problem (the CLI exits 2); `DataError` is
bad input data (exit 1). Both carry a message that names what, where, what was
found, and the fix. Only the CLI edge turns them into click errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class MentorError(Exception):
    """Base class of every error mentor raises on purpose."""

    exit_code = 1


class ConfigError(MentorError):
    """Wrong options, config file, or a missing input path: exit code 2."""

    exit_code = 2


class DataError(MentorError):
    """Input data that cannot be used as it is: exit code 1."""

    exit_code = 1


class SchemaError(DataError):
    """A dataset does not match the canonical schema."""


class EngineError(MentorError):
    """The inference engine failed (died, ran out of memory, ...): exit code 1.

    Raised by a backend with a one-line reason; stages add which stage and
    shard it was working on. The engine's own log holds the details.
    """

    exit_code = 1


class CorruptFileError(DataError, ValueError):
    """A file mentor wrote (a marker, stats.json, ...) that no longer parses: edited or cut short.

    Also a ValueError, so code that treats an unreadable bookkeeping file as absent keeps doing so.
    """


def config_error(exc: ValidationError, where: str = "", prefix: str = "", flags: bool | dict[str, str] = False) -> ConfigError:
    """The one-line `ConfigError` for a pydantic `ValidationError`: ``where: field: problem; field: problem``.

    ``where`` names the file (or section, or "invalid hint config") the values came from; ``prefix`` is the
    dotted path of the section inside it (``trainer.config``). ``flags`` names fields as command-line flags
    (``k_failed`` -> ``--k-failed``); a dict gives the flags whose names differ from their field's.
    A scalar value that was rejected is quoted (``found: -1``; never one of a field named like a key or
    token); an unknown key says to remove it.
    """
    parts = [_problem(e, prefix, flags) for e in exc.errors()]
    return ConfigError(": ".join(p for p in (where, "; ".join(parts)) if p))


_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def _problem(e: dict, prefix: str, flags: bool | dict[str, str]) -> str:
    loc = [str(p) for p in e["loc"]]
    if flags is not False and loc:  # a flag's list index or dict key is in the value quoted below
        field = (flags if isinstance(flags, dict) else {}).get(loc[0]) or "--" + loc[0].replace("_", "-")
    else:
        field = ".".join([prefix, *loc] if prefix else loc)
    if e["type"] == "extra_forbidden":
        return f"{field}: unknown key (remove it or fix its spelling)"
    msg = e["msg"]
    for p in _PYDANTIC_PREFIXES:
        msg = msg.removeprefix(p)
    value = e.get("input")
    secret = any(w in (loc[-1] if loc else "").lower() for w in ("key", "token", "secret", "password"))
    if e["type"] != "missing" and not secret and (value is None or isinstance(value, (str, int, float))):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        if shown not in msg:
            msg = f"{msg} (found: {shown})"
    return f"{field}: {msg}" if field else msg  # a model-level check names its fields itself
