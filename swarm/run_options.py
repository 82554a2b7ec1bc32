"""``swarm run``'s options: one flat model whose fields are the command's flags (names, defaults, help).

As ``swarm serve``'s :class:`~swarm.serve_options.ServeOptions`: the command's Typer signature is
generated from the fields (``swarm/cli.py``), and each field that sets a
:class:`~swarm.client.RunnerConfig` field names it (``to``), so a configuration error is reported as one
line naming the flag (``--heartbeat: Input should be greater than 0``).

Like ``swarm.serve_options`` this module imports little (``swarm --help`` stays quick): the client is
imported when :meth:`RunOptions.runner_config` is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import ValidationError

from swarm.errors import ConfigError
from swarm.serve_options import FlagOptions, option

if TYPE_CHECKING:
    from swarm.client import RunnerConfig


class RunOptionsError(ConfigError):
    """``swarm run`` options that cannot run; the message names the option (``--group-size: …``)."""


class RunOptions(FlagOptions):
    """``swarm run``'s arguments and options, one field per flag (``group_size`` is ``--group-size``)."""

    error: ClassVar[type[ConfigError]] = RunOptionsError

    workflow: str = option(
        ..., "Workflow file (async def run(task, llm)), or FILE.py:Name.", cli={"argument": True}
    )
    server: list[str] = option(
        ..., "Server URL; repeat as NAME=URL for multi-model workflows (llm is then a dict)."
    )
    dataset: str = option(..., "Tasks: JSONL file, saved HF dataset dir, or FILE.py:function.")
    group_size: int = option(4, "G: episodes per task (one GRPO group).", to="group_size")
    concurrency: int = option(8, "N: most episodes at once.", to="concurrency")
    epochs: int = option(1, "Passes over the dataset.", to="epochs")
    max_tasks: int | None = option(None, "Use only the first M tasks.", to="max_tasks")
    split: str | None = option(None, "Split of a saved HF DatasetDict.")
    eval_dataset: str | None = option(None, "Eval tasks (same formats as --dataset).")
    eval_every: int | None = option(None, "Eval round after every K train tasks.", to="eval_every")
    eval_group_size: int = option(1, "Episodes per eval task.", to="eval_group_size")
    family: str | None = option(None, "Task family for cocktail quotas.", to="family")
    trainable_agent: list[str] = option(
        [], "Agent whose calls are trained (repeat; default: all).", to="trainable_agents"
    )
    client_id: str | None = option(None, "Client id (default: runner-<workflow name>).", to="client_id")
    tenant: str | None = option(
        None,
        "LoRA tenant every episode (train and eval) is begun under, on a server started with --tenants.",
        to="tenant",
    )
    state_dir: Path | None = option(
        None, "Resume file folder (default: .swarm/runs/<workflow name>).", to="state_dir"
    )
    fresh: bool = option(False, "Forget earlier progress in the state dir.", cli={"decls": ["--fresh"]})
    rerun_aborted: bool = option(
        False,
        "Resume: run again the episodes the workflow failed.",
        to="rerun_aborted",
        cli={"decls": ["--rerun-aborted"]},
    )
    heartbeat: float = option(30.0, "Seconds between heartbeats of a running episode.", to="heartbeat_s")
    episode_timeout: float | None = option(
        None,
        "Seconds a workflow may run; then its episode is aborted and re-run (infra).",
        to="episode_timeout_s",
    )
    infra_retries: int = option(2, "Re-runs of an infra-failed episode.", to="infra_retries")
    vote_every: int | None = option(
        None,
        "Voting batch policies: vote ready after every K train tasks (a round), heartbeat the client, and "
        "leave at the end.",
        to="vote_every",
    )
    progress: bool = option(True, "Draw the live progress bar.")
    client_token: str | None = option(
        None,
        "Client token of servers started with --client-token.",
        cli={"secret": True, "envvar": "SWARM_CLIENT_TOKEN"},
    )

    @property
    def workflow_name(self) -> str:
        """The workflow file's stem (``math.py:Agent`` → ``math``): names the default state dir and id."""
        return Path(self.workflow.split(":")[0]).stem

    @property
    def state_path(self) -> Path:
        """The resume file's folder: ``--state-dir``, else ``.swarm/runs/<workflow name>``."""
        return self.state_dir if self.state_dir is not None else Path(".swarm") / "runs" / self.workflow_name

    def servers(self) -> dict[str, str]:
        """Server URL by name: ``URL`` (one server, named ``default``) or ``NAME=URL`` per server.

        Raises:
            RunOptionsError: a malformed ``--server``, a name given twice, or unnamed servers among several.
        """
        parsed: dict[str, str] = {}
        for spec in self.server:
            name, sep, url = spec.partition("=")
            if not sep:
                name, url = "default", spec
            if not url.startswith(("http://", "https://")):
                raise RunOptionsError(f"--server {spec}: expected URL or NAME=URL with an http(s):// URL")
            if name in parsed:
                raise RunOptionsError(
                    f"--server {spec}: the name {name!r} is given twice (use NAME=URL for each server)"
                )
            parsed[name] = url
        if "default" in parsed and len(parsed) > 1:
            raise RunOptionsError("--server: name every server (NAME=URL) when there are several")
        return parsed

    def check(self) -> dict[str, str]:
        """What is checked before anything is read: :meth:`servers` (returned) and the eval options.

        Raises:
            RunOptionsError: the first problem, in one line naming the option.
        """
        servers = self.servers()
        if self.eval_every is not None and self.eval_dataset is None:
            raise RunOptionsError("--eval-every needs --eval-dataset")
        return servers

    def runner_config(self) -> RunnerConfig:
        """The :class:`RunnerConfig` these options describe (client id and state dir defaulted from the
        workflow's name).

        Raises:
            RunOptionsError: a value the runner refuses, in one line naming the option.
        """
        from swarm.client import RunnerConfig

        values = {path[0]: getattr(self, name) for name, path in self.targets()}
        values.update(
            trainable_agents=self.trainable_agent or None,
            client_id=self.client_id or f"runner-{self.workflow_name}",
            state_dir=self.state_path,
        )
        try:
            return RunnerConfig.model_validate(values)
        except ValidationError as exc:
            raise self.invalid(exc) from None
