"""Errors of the client side (runner, workflow loading, datasets, multi-model episodes).

::

    SwarmError
    ├── WorkflowLoadError (ValueError)   the workflow file is missing, fails to import or has no ``run``
    ├── DatasetError (ValueError)        a dataset cannot be read (missing file, bad JSONL line, not a dict)
    ├── RunnerError                      the run cannot go on (e.g. the server rejects our episodes: 4xx)
    ├── EpisodeLost                      the server no longer knows an open episode (see _failures.py)
    └── MultiEpisodeError                a multi-model episode could not begin or finish on every server
        ├── UndecidedFinishError         the primary's commit got no answer: the servers settle it
        └── PartialFinishError           (no longer raised: the multi-server finish is atomic)

Messages never contain episode keys.
"""

from __future__ import annotations

from swarm.errors import SwarmError


class WorkflowLoadError(SwarmError, ValueError):
    """A workflow file cannot be used: missing, raises on import, or defines no ``async def run``."""

    error_type = "workflow_error"

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


class DatasetError(SwarmError, ValueError):
    """A dataset cannot be read; ``line`` is the 1-based JSONL line at fault, when there is one."""

    error_type = "dataset_error"

    def __init__(self, source: str, message: str, *, line: int | None = None) -> None:
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line


class RunnerError(SwarmError):
    """The run cannot continue (a configuration the server rejects, a server that stays unreachable)."""

    error_type = "runner_error"


class MultiEpisodeError(SwarmError):
    """A multi-model episode failed as a whole: every member was aborted (none finished).

    Attributes:
        aborted: names of the members aborted by this failure.
        failed: member name → the error of that member.
    """

    error_type = "multi_episode_error"

    def __init__(self, message: str, *, aborted: list[str], failed: dict[str, BaseException]) -> None:
        super().__init__(message)
        self.aborted = aborted
        self.failed = failed


class UndecidedFinishError(MultiEpisodeError):
    """A multi-server finish whose primary commit got no answer (its server died mid-commit).

    Nothing was aborted: the servers settle the transaction (every member finished, or none; see
    docs/ARCHITECTURE.md §Multi-server finish).

    Attributes:
        txn_id: the transaction.
        primary: the primary member's name.
    """

    def __init__(self, txn_id: str, primary: str, cause: BaseException) -> None:
        super().__init__(
            f"transaction {txn_id}: the commit of primary member {primary!r} got no answer ({cause}); "
            "the servers settle it (all members finished, or none)",
            aborted=[],
            failed={primary: cause},
        )
        self.txn_id = txn_id
        self.primary = primary


class PartialFinishError(MultiEpisodeError):
    """Finishing failed on a member after another member had already finished.

    No longer raised by :class:`~swarm.client.MultiEpisode`, whose finish is atomic across servers since
    the two-phase finish; kept so that callers catching it keep working.
    """

    def __init__(
        self, message: str, *, finished: list[str], aborted: list[str], failed: dict[str, BaseException]
    ) -> None:
        super().__init__(message, aborted=aborted, failed=failed)
        self.finished = finished
