"""User-facing errors: each carries an exit code and a message that says how to fix the call."""

from __future__ import annotations


class MetacollectError(Exception):
    """Base of the errors a user can fix; the CLI prints them as one line."""

    exit_code = 1


class UsageError(MetacollectError):
    """The call itself is wrong (missing script, bad option)."""

    exit_code = 2


class ConfigError(UsageError):
    """A metacollect config value is invalid."""


class StoreExistsError(UsageError):
    """The store path exists and ``overwrite`` was not given."""


class StoreLockedError(UsageError):
    """Another run, still alive, is writing the store."""


class OutputError(MetacollectError):
    """An output (report, export, job script) could not be written; nothing partial is left."""


class StoreError(MetacollectError):
    """A store cannot be written or read."""

    exit_code = 3


class NotAStoreError(StoreError):
    """The path is not a metacollect store."""


class SchemaVersionError(StoreError):
    """The store was written by a newer schema than this reader knows."""


class ValidationError(StoreError):
    """The store does not hold against the schema."""

    exit_code = 4
