"""Swarm clients: open episodes on swarm servers and run agent workflows in them.

- :class:`AsyncSwarmClient`: begin, finish, abort and heartbeat episodes, read and steer a server;
  :class:`SwarmClient` is its blocking face (the same client run on a private event loop).
- :class:`MultiEpisode`: one rollout over several servers, finished or aborted together.
- :class:`Runner` (``swarm run``): a workflow file over a dataset, G episodes per task, N at a time,
  with resume, eval rounds and infrastructure-failure handling.
- :func:`check_model_path` / :func:`load_tokenizer`: check a ``--model`` before serving it, and load a
  model's tokenizer to read recorded token ids (each imports torch only when called).
- Re-exported for programs that drive servers: ``ClientError``/``SwarmError``/``ModelLoadError``, the
  control answers (``StatusView``, ``ServerStepMetrics``, ``Event``, ``EpisodeView``, ``TenantView``) and ``ServeOptions``
  (``swarm serve``'s options, validated in process).
- :mod:`swarm.client.console_script` (not imported here): ``run_console_script``, a Typer app run as a
  console script whose usage mistakes read as one ``error:`` line.

Each name is imported on first use (PEP 562), so importing a submodule (``swarm.client.console_script``,
``swarm.client.workflow``) does not load the client, the protocol and HTTPX: a command line that never
talks to a server (``a3r runs``) does not pay for them.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarm.client._client import AsyncEpisode, AsyncSwarmClient, RetryPolicy
    from swarm.client._datasets import Task, TaskSet
    from swarm.client._errors import (
        DatasetError,
        MultiEpisodeError,
        PartialFinishError,
        RunnerError,
        UndecidedFinishError,
        WorkflowLoadError,
    )
    from swarm.client._failures import EpisodeLost, FailureKind, classify_failure
    from swarm.client._loader import load_workflow
    from swarm.client._models import check_model_path, load_tokenizer
    from swarm.client._multi import MultiEpisode
    from swarm.client._progress import ProgressLog
    from swarm.client._runner import Runner, RunnerConfig, RunSummary, run_workflow
    from swarm.client._sync import Episode, SwarmClient
    from swarm.client.workflow import LLM, Result

    # Re-exported, not defined here (so not in __all__): what a program driving servers (a3r) needs besides the
    # client: its errors, the control answers it reads, and ``swarm serve``'s options.
    from swarm.errors import ClientError as ClientError
    from swarm.errors import ModelLoadError as ModelLoadError
    from swarm.errors import SwarmError as SwarmError
    from swarm.protocol import EpisodeView as EpisodeView
    from swarm.protocol import Event as Event
    from swarm.protocol import ServerStepMetrics as ServerStepMetrics
    from swarm.protocol import StatusView as StatusView
    from swarm.protocol import TenantView as TenantView
    from swarm.serve_options import ServeOptions as ServeOptions
    from swarm.serve_options import ServeOptionsError as ServeOptionsError

_SOURCES: dict[str, str] = {
    "AsyncEpisode": "swarm.client._client",
    "AsyncSwarmClient": "swarm.client._client",
    "ClientError": "swarm.errors",
    "DatasetError": "swarm.client._errors",
    "Episode": "swarm.client._sync",
    "EpisodeLost": "swarm.client._failures",
    "EpisodeView": "swarm.protocol",
    "Event": "swarm.protocol",
    "FailureKind": "swarm.client._failures",
    "LLM": "swarm.client.workflow",
    "ModelLoadError": "swarm.errors",
    "MultiEpisode": "swarm.client._multi",
    "MultiEpisodeError": "swarm.client._errors",
    "PartialFinishError": "swarm.client._errors",
    "ProgressLog": "swarm.client._progress",
    "Result": "swarm.client.workflow",
    "RetryPolicy": "swarm.client._client",
    "RunSummary": "swarm.client._runner",
    "Runner": "swarm.client._runner",
    "RunnerConfig": "swarm.client._runner",
    "RunnerError": "swarm.client._errors",
    "ServeOptions": "swarm.serve_options",
    "ServeOptionsError": "swarm.serve_options",
    "ServerStepMetrics": "swarm.protocol",
    "StatusView": "swarm.protocol",
    "SwarmClient": "swarm.client._sync",
    "SwarmError": "swarm.errors",
    "TenantView": "swarm.protocol",
    "Task": "swarm.client._datasets",
    "TaskSet": "swarm.client._datasets",
    "UndecidedFinishError": "swarm.client._errors",
    "WorkflowLoadError": "swarm.client._errors",
    "check_model_path": "swarm.client._models",
    "classify_failure": "swarm.client._failures",
    "load_tokenizer": "swarm.client._models",
    "load_workflow": "swarm.client._loader",
    "run_workflow": "swarm.client._runner",
}
"""Where each public (and re-exported) name is defined: imported on first access."""

__all__ = [
    "LLM",
    "AsyncEpisode",
    "AsyncSwarmClient",
    "DatasetError",
    "Episode",
    "EpisodeLost",
    "FailureKind",
    "MultiEpisode",
    "MultiEpisodeError",
    "PartialFinishError",
    "ProgressLog",
    "Result",
    "RetryPolicy",
    "RunSummary",
    "Runner",
    "RunnerConfig",
    "RunnerError",
    "SwarmClient",
    "Task",
    "TaskSet",
    "UndecidedFinishError",
    "WorkflowLoadError",
    "check_model_path",
    "classify_failure",
    "load_tokenizer",
    "load_workflow",
    "run_workflow",
]


def __getattr__(name: str) -> Any:
    """Import a name's module on first access and cache the name in this package."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'swarm.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SOURCES))
