"""The swarm error tree.

::

    SwarmError
    ├── ConfigError (ValueError)         invalid configuration or CLI option
    │   └── BatchConfigError             invalid batch policy or quota configuration (batch)
    ├── ModelLoadError                   a model cannot be found or loaded
    ├── RequestError (ValueError)        a client request is invalid (HTTP 400/404/422)
    │   ├── ContextLengthError           the prompt does not fit the context window
    │   ├── PromptError                  messages/tools the chat template cannot render (tracking)
    │   └── UnknownFamilyError           an episode names a family the quotas do not list (batch)
    ├── MergeError (ValueError)          inconsistent call records of an episode (tracking; a bug)
    ├── AuthError                        unknown, finished or wrong-kind key (HTTP 401/403)
    ├── EpisodeNotFound (LookupError)    no such episode (HTTP 404)
    ├── EpisodeStateError                episode not open for this action (HTTP 409)
    ├── Unavailable                      engine paused/training/draining or quota full (HTTP 503/429)
    ├── InsufficientMemory               a tenant's adapter or optimizer did not fit (HTTP 507)
    ├── TrainerError (ValueError)        a batch the trainer cannot use (train)
    ├── StepInterrupted                  a step given up for the server's stop, nothing applied (train)
    └── ClientError                      raised by SwarmClient for an HTTP error answer

Every error carries the context a caller needs (episode id, HTTP status) and a message safe to show:
no secret is ever formatted into one.
"""

from __future__ import annotations


class SwarmError(Exception):
    """Base of every error raised by the swarm package."""

    status_code: int = 500
    error_type: str = "server_error"
    error_code: str | None = None
    """A finer machine-readable code where OpenAI's API sends one (its error body's ``code``), else ``None``."""


class ConfigError(SwarmError, ValueError):
    """An invalid configuration value or command-line option."""

    status_code = 400
    error_type = "invalid_config"


class ModelLoadError(SwarmError):
    """A model cannot be located or loaded."""

    error_type = "model_load_error"


class RequestError(SwarmError, ValueError):
    """A client request is invalid."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, status_code: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.param = param


class ContextLengthError(RequestError):
    """The prompt (plus at least one completion token) does not fit the model's context window."""

    error_type = "context_length_exceeded"


class AuthError(SwarmError):
    """A missing, unknown, finished or wrong-kind credential."""

    status_code = 401
    error_type = "authentication_error"

    def __init__(self, message: str, *, status_code: int = 401) -> None:
        super().__init__(message)
        self.status_code = status_code


def quoted(value: str, limit: int = 64) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with the full length said, so
    a client's oversized id or name is never echoed back whole."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"


class EpisodeNotFound(SwarmError, LookupError):
    """No episode with this id."""

    status_code = 404
    error_type = "not_found"

    def __init__(self, episode_id: str) -> None:
        super().__init__(
            f"episode {quoted(episode_id)} not found (episodes still open when a server stops are not kept: "
            "begin a new one)"
        )
        self.episode_id = episode_id


class EpisodeStateError(SwarmError):
    """The episode is not in a state that allows this action (e.g. finishing an aborted episode)."""

    status_code = 409
    error_type = "conflict"

    def __init__(self, episode_id: str, message: str) -> None:
        super().__init__(message)
        self.episode_id = episode_id


RATE_LIMIT_TYPE = "requests"
"""The error ``type`` of a 429 in OpenAI's shape: what OpenAI's API sends for a requests-per-minute limit
(``{"type": "requests", "code": "rate_limit_exceeded"}``; ``"tokens"`` for a tokens-per-minute one,
which this server has not). Anthropic's shape says ``rate_limit_error`` (`anthropic_format.error_type`)."""

RATE_LIMIT_CODE = "rate_limit_exceeded"
"""The error ``code`` of a 429 in OpenAI's shape, as OpenAI's API sends it."""


class InsufficientMemory(SwarmError):
    """Out of device memory while building something a request asked for (a tenant's adapter, trainer
    and optimizer state); nothing of it is left behind. HTTP 507 (RFC 4918: the server cannot store what
    the request needs), so clients do not retry it as they retry a 503."""

    status_code = 507
    error_type = "insufficient_memory"


class Unavailable(SwarmError):
    """The server cannot take this now; retry after ``retry_after_s`` seconds. ``status_code`` 429 (a
    client's limit is reached, not the server's) answers as OpenAI's rate limits do (`RATE_LIMIT_TYPE`,
    `RATE_LIMIT_CODE`)."""

    status_code = 503
    error_type = "unavailable"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, status_code: int = 503) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.status_code = status_code
        if status_code == 429:
            self.error_type, self.error_code = RATE_LIMIT_TYPE, RATE_LIMIT_CODE


class Paused(Unavailable):
    """An operator paused the server (``POST /api/v1/pause``) or the tenant (paused or failed, until the
    admin resumes it): 503 + Retry-After as any unavailable answer, which clients retry, typed ``paused`` so
    that a client can say why it waits (`swarm.client` logs it once per request) rather than wait silently."""

    error_type = "paused"


class ClientError(SwarmError):
    """An error answer from a swarm server, raised by :class:`swarm.client.SwarmClient`."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        error_type: str = "",
        url: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_type = error_type
        self.url = url
        self.retry_after_s = retry_after_s
        """The answer's ``Retry-After`` in seconds (429/503), ``None`` when it gave none."""
