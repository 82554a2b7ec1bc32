"""Swarm clients: open episodes on swarm servers and run agent workflows in them.

- :class:`AsyncSwarmClient`: begin, finish, abort and heartbeat episodes, read and steer a server;
  :class:`SwarmClient` is its blocking face (the same client run on a private event loop).
- :class:`MultiEpisode`: one rollout over several servers, finished or aborted together.
- :class:`Runner` (``swarm run``): a workflow file over a dataset, G episodes per task, N at a time,
  with resume, eval rounds and infrastructure-failure handling.
- :func:`check_model_path` / :func:`load_tokenizer`: check a ``--model`` before serving it, and load a
  model's tokenizer to read recorded token ids (each imports torch only when called).
- Re-exported for programs that drive servers: ``ClientError``/``SwarmError``/``ModelLoadError``, the
  control answers (``StatusView``, ``ServerStepMetrics``, ``Event``, ``EpisodeView``) and ``ServeOptions``
  (``swarm serve``'s options, validated in process).
- :mod:`swarm.client.console_script` (not imported here): ``run_console_script``, a Typer app run as a
  console script whose usage mistakes read as one ``error:`` line.
"""

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
from swarm.serve_options import ServeOptions as ServeOptions
from swarm.serve_options import ServeOptionsError as ServeOptionsError

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
