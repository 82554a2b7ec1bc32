"""Errors raised by the knowledge store.

Every error the store raises derives from `StoreError`; where an error stands in for a standard
library error it also subclasses that one, so callers may catch either::

    StoreError
    ├── NotFound                 (also LookupError)   a study, run, patch... or the store file is missing
    ├── InvalidTransition        (also ValueError)    a status change the lifecycle forbids
    │   └── PreregistrationError                      a hypothesis attached after runs began
    ├── InvalidInput             (also ValueError)    a field value fails validation
    ├── IntegrityViolation       (also ValueError)    a write the schema's constraints refuse
    ├── StoreConfigError         (also ValueError)    a malformed URL or path
    ├── SchemaVersionError                            the database is newer than this code
    └── StoreUnavailable         (also ConnectionError) the database cannot be reached or stays locked

SQLAlchemy and Alembic exceptions are translated where they enter (`memory._db.translate_errors`) and
chained to the original, so no foreign exception type escapes the public API. Messages never contain
configuration values, so no secret can leak through them.
"""

from __future__ import annotations

__all__ = [
    "IntegrityViolation",
    "InvalidInput",
    "InvalidTransition",
    "NotFound",
    "PreregistrationError",
    "SchemaVersionError",
    "StoreConfigError",
    "StoreError",
    "StoreUnavailable",
]


class StoreError(Exception):
    """Base class of every error raised by `memory`."""


class NotFound(StoreError, LookupError):
    """A record (or the store itself) does not exist.

    Attributes:
        entity: Kind of record looked up, e.g. ``"study"`` or ``"patch"``.
        key: Primary key or path that was looked up.
    """

    def __init__(self, entity: str, key: object) -> None:
        self.entity = entity
        self.key = key
        super().__init__(f"{entity} {key!s} not found")


class InvalidTransition(StoreError, ValueError):
    """A status change that the record's lifecycle forbids (e.g. applying a rejected patch).

    Attributes:
        entity: Kind of record, e.g. ``"patch"``.
        key: Its primary key.
        current: Status the record has now.
        requested: Status the caller asked for.
    """

    def __init__(self, entity: str, key: object, current: str, requested: str, reason: str = "") -> None:
        self.entity = entity
        self.key = key
        self.current = current
        self.requested = requested
        detail = f": {reason}" if reason else ""
        super().__init__(f"{entity} {key!s} is {current}; cannot move to {requested}{detail}")


class PreregistrationError(InvalidTransition):
    """A hypothesis was attached to an experiment that already has runs.

    Hypotheses are registered before the runs that test them (pre-registration), so a hypothesis can
    never be fitted to results already seen.
    """


class InvalidInput(StoreError, ValueError):
    """A value passed to the store fails validation (empty statement, confidence outside [0, 1]...).

    The message names the fields and the rule, never the rejected values (they may hold secrets).
    """


class IntegrityViolation(StoreError, ValueError):
    """The database refused a write because of a constraint (duplicate key, dangling reference)."""


class StoreConfigError(StoreError, ValueError):
    """The store location (path or SQLAlchemy URL) is malformed or unsupported."""


class SchemaVersionError(StoreError):
    """The database schema is at a revision this version of the code does not know (it is newer)."""


class StoreUnavailable(StoreError, ConnectionError):
    """The database server cannot be reached, or a lock was not obtained within the busy timeout."""
