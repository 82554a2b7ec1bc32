"""The a3r error tree.

::

    A3RError
    ├── ProviderConfigError (ValueError)   unknown provider, missing API key, malformed base URL
    ├── ProviderError                      the LLM provider answered badly (after its own retries)
    ├── OfflineUnsupported                 the offline provider cannot do this; names what is needed
    ├── PlanError (ValueError)             a plan names an unknown template or invalid parameters
    ├── PatchNotAllowed (ValueError)       a patch touches a file outside the allow-list
    ├── PatchConflict                      a patch no longer applies to the workspace file
    ├── SwarmProcessError                  a swarm server or client subprocess could not start
    └── ThreadNotFound (LookupError)       ``a3r resume`` of a thread the checkpointer does not know

Messages are safe to print: no API key or episode key is ever formatted into one.
"""

from __future__ import annotations

__all__ = [
    "A3RError",
    "OfflineUnsupported",
    "PatchConflict",
    "PatchNotAllowed",
    "PlanError",
    "ProviderConfigError",
    "ProviderError",
    "SwarmProcessError",
    "ThreadNotFound",
]


class A3RError(Exception):
    """Base of every error raised by the a3r package."""


class ProviderConfigError(A3RError, ValueError):
    """The LLM provider is misconfigured (unknown kind, missing key, malformed URL)."""


class ProviderError(A3RError):
    """The LLM provider failed or returned an answer that does not fit the schema."""


class OfflineUnsupported(A3RError):
    """The offline provider cannot serve this request; the message says what is needed instead."""


class PlanError(A3RError, ValueError):
    """A plan is invalid: unknown template, bad parameters or an impossible budget."""


class PatchNotAllowed(A3RError, ValueError):
    """A patch targets a file that patches may not touch (evaluators, held-out data, limits)."""


class PatchConflict(A3RError):
    """A patch's base no longer matches the file in the workspace."""


class SwarmProcessError(A3RError):
    """A ``swarm serve`` or ``swarm run`` subprocess failed to start or to answer."""


class ThreadNotFound(A3RError, LookupError):
    """No checkpoint exists for this thread id."""
