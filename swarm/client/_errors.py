"""Errors of the client side (runner, workflow loading, datasets, multi-model episodes).

::

    SwarmError
    ├── WorkflowLoadError (ValueError)   the workflow file is missing, fails to import or has no ``run``
    ├── DatasetError (ValueError)        a dataset cannot be read (missing file, bad JSONL line, not a dict)
    ├── RunnerError                      the run cannot go on (e.g. the server rejects our episodes: 4xx)
    ├── EpisodeLost                      the server no longer knows an open episode (see _failures.py)
    └── MultiEpisodeError                a multi-model episode could not begin or finish on every server
        └── PartialFinishError           finished on some servers, aborted on the others

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


class PartialFinishError(MultiEpisodeError):
    """Finishing failed on a member after another member had already finished.

    The finished members cannot be undone (their episodes are committed to those servers' pools);
    the others were aborted as infrastructure failures. ``finished`` names the committed ones.
    """

    def __init__(
        self, message: str, *, finished: list[str], aborted: list[str], failed: dict[str, BaseException]
    ) -> None:
        super().__init__(message, aborted=aborted, failed=failed)
        self.finished = finished
