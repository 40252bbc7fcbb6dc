"""Error taxonomy.

`ConfigError` is a usage/configuration problem (the CLI exits 2); `DataError` is
bad input data (exit 1). Both carry a message that names what, where, what was
found, and the fix. Only the CLI edge turns them into click errors.
"""

from __future__ import annotations


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
