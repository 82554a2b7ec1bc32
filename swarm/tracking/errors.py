"""Errors of the tracker (prompt rendering and sample building).

They extend the swarm error tree (:mod:`swarm.errors`)::

    SwarmError
    ├── RequestError (ValueError)
    │   └── PromptError          the messages/tools of a request cannot be rendered (HTTP 400)
    └── MergeError (ValueError)  call records of an episode are inconsistent (a server bug, not user input)
"""

from __future__ import annotations

from swarm.errors import RequestError, SwarmError


class PromptError(RequestError):
    """A chat request cannot be rendered to prompt ids (bad message shape, role or template failure)."""


class MergeError(SwarmError, ValueError):
    """An episode's call records are inconsistent (e.g. ``len(logprobs) != len(completion_ids)``)."""

    error_type = "merge_error"

    def __init__(self, message: str, *, episode_id: str = "", call_index: int | None = None) -> None:
        super().__init__(message)
        self.episode_id = episode_id
        self.call_index = call_index
