"""The public front of ``swarm.client`` (encode/httpx tests/test_exported_members.py style)."""

from __future__ import annotations

import swarm.client


def test_exported_members() -> None:
    assert set(swarm.client.__all__) == {
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
    }
    for name in swarm.client.__all__:
        assert getattr(swarm.client, name).__module__.startswith("swarm.client"), name
