"""The dataset runner behind ``swarm run``: G episodes per task, N at a time, with resume and eval.

For each epoch, each task (in dataset order, the first ``max_tasks``) and each group member
``g = 0 … G-1``, the runner opens an episode (``task_id`` = the task's id, so the server groups the
G episodes; GRPO), calls the workflow's ``run(task, llm)`` and finishes the episode with the reward it
returns. At most ``concurrency`` episodes run at once. Every ``eval_every`` train tasks it also runs
an eval round: each eval task ``eval_group_size`` times, as ``kind=eval`` episodes (never trained).

Failures (see :mod:`swarm.client._failures`):

- the workflow raises an agent error → the episode is aborted (it counts in its group as a failed
  rollout) and the traceback is printed at once;
- an infrastructure error (timeouts, transport errors, 429/5xx after the client's retries, a key that
  stopped working because the server restarted, a heartbeat that finds the episode gone) → aborted with
  ``infra_failure=true`` and run again, up to ``infra_retries`` times, with backoff;
- the server rejecting our episodes outright (a 4xx other than 429, e.g. a family the quotas do not
  list), or ``max_consecutive_infra`` infra failures in a row → :class:`RunnerError`: the run stops
  (open episodes are aborted as infra failures; a restart resumes).

While a workflow runs, a heartbeat goes to its episode(s) every ``heartbeat_s`` seconds; if the server
has lost the episode the workflow is cancelled at once and the episode counts as an infra failure, and
so does a workflow still running after ``episode_timeout_s``. The OpenAI clients a workflow made with
``llm.openai()`` are closed when its episode ends.

Votes (``vote_every=K``, for the ``all_clients_ready`` / ``any_client_ready`` batch policies): after every
K train tasks whose G episodes have all ended the runner votes ready on every server, it heartbeats its
client every ``heartbeat_s`` (also between episodes), and at the end it votes for the last partial round
and leaves (docs/ARCHITECTURE.md §Batch policies and quotas).

Resume: see :mod:`swarm.client._progress` (``state_dir``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.traceback import Traceback

from swarm.client._client import AsyncSwarmClient, RetryPolicy
from swarm.client._datasets import Task, TaskSet
from swarm.client._errors import DatasetError, MultiEpisodeError, PartialFinishError, RunnerError
from swarm.client._failures import EpisodeLost, FailureKind, classify_failure
from swarm.client._loader import WorkflowFn, WorkflowOutput
from swarm.client._multi import MultiEpisode
from swarm.client._progress import ProgressLog, SlotKey
from swarm.client.workflow import Result
from swarm.errors import ClientError
from swarm.protocol import TENANT_ID_PATTERN, EpisodeKind, EpisodeStatus


class RunnerConfig(BaseModel):
    """Settings of one runner (the ``swarm run`` options)."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(default=4, ge=1)
    """G: episodes per task and epoch (one GRPO group)."""
    concurrency: int = Field(default=8, ge=1)
    """N: most episodes running at once."""
    epochs: int = Field(default=1, ge=1)
    max_tasks: int | None = Field(default=None, ge=1)
    """Use only the first M tasks of the dataset (per epoch)."""
    eval_every: int | None = Field(default=None, ge=1)
    """Run an eval round after every K train tasks (needs an eval dataset)."""
    eval_group_size: int = Field(default=1, ge=1)
    family: str | None = None
    """Task family for cocktail quotas; a task's own ``family`` field wins."""
    trainable_agents: list[str] | None = None
    client_id: str = "runner"
    tenant: str | None = Field(default=None, pattern=TENANT_ID_PATTERN)
    """The LoRA tenant every episode is begun under, train and eval alike (a server started with
    ``swarm serve --tenants N``; the episode samples and trains with that tenant's adapter). ``None``:
    the server's one policy."""
    episode_timeout_s: float | None = Field(default=None, gt=0)
    """Cancel a workflow still running after this many seconds: its episode is aborted as an infra
    failure (a timeout) and re-run like one. ``None``: no limit."""
    heartbeat_s: float = Field(default=30.0, gt=0)
    """Seconds between heartbeats of a running episode (keep below the server's episode timeout)."""
    infra_retries: int = Field(default=2, ge=0)
    """Extra tries of an episode after an infrastructure failure (a restart re-runs the rest)."""
    retry_backoff_s: float = Field(default=1.0, ge=0)
    """First wait before re-running an infra-failed episode (doubles each time)."""
    max_consecutive_infra: int = Field(default=25, ge=1)
    """Stop the run (:class:`RunnerError`) after this many infra failures in a row: the server or an
    outside service is down, and a restarted runner resumes once it is back."""
    vote_every: int | None = Field(default=None, ge=1)
    """For the ``all_clients_ready`` / ``any_client_ready`` batch policies: vote ready on every server after
    every K train tasks have all their G episodes ended (a *round*), heartbeat the client every
    ``heartbeat_s`` so the servers count it as alive, and at the end of the run vote for the last partial
    round and leave (the servers still train its episodes). ``None``: never vote."""
    state_dir: Path | None = None
    """Holds ``progress.jsonl`` (resume); ``None`` keeps no state."""
    rerun_aborted: bool = False
    """On resume, run again the slots whose episode the agent failed (after fixing the workflow)."""


@dataclass(frozen=True)
class Slot:
    """One episode to run: a task, a group member and a round (epoch or eval round)."""

    kind: EpisodeKind
    round: int
    task: Task
    member: int

    @property
    def key(self) -> SlotKey:
        return (self.kind.value, self.round, self.task.task_id, self.member)


@dataclass
class RunSummary:
    """Counts of one run (this process only, plus ``resumed`` slots skipped from the progress file)."""

    finished: int = 0
    agent_failures: int = 0
    infra_failures: int = 0
    """Episodes aborted as infra failures (including the ones re-run successfully afterwards)."""
    partial_finishes: int = 0
    votes: int = 0
    """Readiness votes cast (one per round, on every server)."""
    tasks_done: int = 0
    """Train (epoch, task) pairs whose G slots have all ended (resumed ones included)."""
    resumed: int = 0
    """Slots skipped because the progress file says they are done."""
    train_rewards: list[float] = field(default_factory=list)
    eval_rewards: dict[int, list[float]] = field(default_factory=dict)
    """Eval round → rewards of its finished episodes."""

    @property
    def train_reward_mean(self) -> float:
        return sum(self.train_rewards) / len(self.train_rewards) if self.train_rewards else math.nan

    def eval_reward_mean(self, round_: int) -> float:
        rewards = self.eval_rewards.get(round_, [])
        return sum(rewards) / len(rewards) if rewards else math.nan


def _reward_of(output: float | Result) -> float:
    return output.reward if isinstance(output, Result) else float(output)


def _normalise(output: WorkflowOutput, names: list[str]) -> float | Result | dict[str, float | Result]:
    """Check a workflow's return value; a mapping must name exactly the servers."""
    if isinstance(output, Mapping):
        if set(output) != set(names):
            raise TypeError(f"run returned rewards for {sorted(output)}, but the servers are {sorted(names)}")
        return {k: v if isinstance(v, Result) else float(v) for k, v in output.items()}
    if isinstance(output, Result):
        return output
    if isinstance(output, bool) or not isinstance(output, int | float):
        raise TypeError(
            f"run must return a float, a Result or {{server: reward}}, not {type(output).__name__}"
        )
    return float(output)


def _metrics_of(rewards: float | Result | dict[str, float | Result]) -> dict[str, float]:
    """The workflow's ``Result.metrics`` (the first server's, with several), finite numbers only."""
    first = next(iter(rewards.values())) if isinstance(rewards, dict) else rewards
    if not isinstance(first, Result):
        return {}
    return {k: float(v) for k, v in first.metrics.items() if isinstance(v, int | float) and math.isfinite(v)}


class Runner:
    """Run a workflow over a dataset against one or several swarm servers.

    Args:
        workflow: the loaded ``run(task, llm)``.
        clients: server name → client. With one server ``llm`` is an :class:`~swarm.client.LLM`; with
            several it is a dict name → LLM and ``run`` may return ``{name: reward}``.
        dataset: train tasks.
        config: runner settings.
        eval_dataset: eval tasks (used when ``config.eval_every`` is set).
        console: where progress and tracebacks go (stderr by default).
        show_progress: draw a live progress bar.
    """

    def __init__(
        self,
        workflow: WorkflowFn,
        clients: Mapping[str, AsyncSwarmClient],
        dataset: TaskSet,
        config: RunnerConfig,
        *,
        eval_dataset: TaskSet | None = None,
        console: Console | None = None,
        show_progress: bool = True,
    ) -> None:
        if not clients:
            raise ValueError("the runner needs at least one server")
        if config.eval_every is not None and eval_dataset is None:
            raise ValueError("eval_every needs an eval dataset")
        self.workflow = workflow
        self.clients = dict(clients)
        self.dataset = dataset
        self.eval_dataset = eval_dataset
        self.config = config
        self.console = console or Console(stderr=True)
        self.show_progress = show_progress
        self.summary = RunSummary()
        self._progress_log = ProgressLog(config.state_dir)
        self._bar: Progress | None = None
        self._bar_task: Any = None
        self._eval_rounds: list[int] = []
        self._members_done: dict[tuple[int, str], int] = {}
        self._infra_streak = 0
        self._voted_at = 0
        """``tasks_done`` when the last vote was cast."""

    @staticmethod
    def default_retry() -> RetryPolicy:
        """Retries for runner clients: patient with busy servers (quotas, training), bounded otherwise."""
        return RetryPolicy(attempts=10, max_wait_s=10.0, deadline_s=3600.0)

    # -- scheduling --------------------------------------------------------------------------------------
    def _train_slots(self) -> Iterator[Slot]:
        cfg = self.config
        count = 0
        for epoch in range(cfg.epochs):
            for task in self.dataset:
                if cfg.max_tasks is not None and task.index >= cfg.max_tasks:
                    break
                for member in range(cfg.group_size):
                    yield Slot(EpisodeKind.TRAIN, epoch, task, member)
                count += 1
                if cfg.eval_every is not None and count % cfg.eval_every == 0:
                    yield from self._eval_slots(count // cfg.eval_every)

    def _eval_slots(self, round_: int) -> Iterator[Slot]:
        assert self.eval_dataset is not None
        self._eval_rounds.append(round_)
        for task in self.eval_dataset:
            for member in range(self.config.eval_group_size):
                yield Slot(EpisodeKind.EVAL, round_, task, member)

    def _total(self) -> int | None:
        cfg = self.config
        if not self.dataset.sized:
            return None
        tasks = len(self.dataset) if cfg.max_tasks is None else min(cfg.max_tasks, len(self.dataset))
        total = tasks * cfg.group_size * cfg.epochs
        if cfg.eval_every is not None and self.eval_dataset is not None:
            if not self.eval_dataset.sized:
                return None
            rounds = (tasks * cfg.epochs) // cfg.eval_every
            total += rounds * len(self.eval_dataset) * cfg.eval_group_size
        return total

    async def run(self) -> RunSummary:
        """Run every slot not yet done; returns the counts.

        Raises:
            RunnerError: the server rejected an episode outright, or too many infra failures came in a
                row (the run stopped; open episodes were aborted).
            DatasetError: a generator source yielded a bad record.
        """
        semaphore = asyncio.Semaphore(self.config.concurrency)
        beater = asyncio.create_task(self._client_heartbeats()) if self.config.vote_every else None
        with self._progress_context():
            try:
                async with asyncio.TaskGroup() as group:
                    for slot in self._train_slots():
                        if self._progress_log.done(slot.key, rerun_aborted=self.config.rerun_aborted):
                            self.summary.resumed += 1
                            self._advance(slot.key)
                            continue
                        await semaphore.acquire()
                        group.create_task(self._run_slot(slot, semaphore))
            except BaseExceptionGroup as eg:
                fatal = [e for e in eg.exceptions if isinstance(e, RunnerError | DatasetError)]
                if fatal:
                    raise fatal[0] from None
                raise
            finally:
                self._progress_log.close()
                if beater is not None:
                    beater.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await beater
        if self.config.vote_every:
            if self.summary.tasks_done > self._voted_at:
                await self._vote()
            await self._leave()
        return self.summary

    # -- readiness votes (all_clients_ready / any_client_ready) -------------------------------------------
    async def _vote(self) -> None:
        """Vote ready on every server (the round is done); a server that cannot take it is reported."""
        self._voted_at = self.summary.tasks_done
        for name, client in self.clients.items():
            try:
                await client.vote_ready()
            except (ClientError, httpx.TransportError) as exc:
                self.console.print(
                    f"[yellow]vote on {escape(name)} failed:[/] {escape(str(exc))}", highlight=False
                )
            else:
                self.summary.votes += 1

    async def _leave(self) -> None:
        for client in self.clients.values():
            with contextlib.suppress(ClientError, httpx.TransportError):
                await client.leave()

    async def _client_heartbeats(self) -> None:
        """Keep this client active on every server while the run lasts (also between episodes)."""
        while True:
            for client in self.clients.values():
                with contextlib.suppress(ClientError, httpx.TransportError):
                    await client.client_heartbeat()
            await asyncio.sleep(self.config.heartbeat_s)

    @contextlib.contextmanager
    def _progress_context(self) -> Any:
        if not self.show_progress:
            yield
            return
        bar = Progress(
            TextColumn("[bold]episodes"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self._bar = bar
        self._bar_task = bar.add_task("episodes", total=self._total(), stats="")
        with bar:
            yield
        self._bar = None

    def _advance(self, key: SlotKey) -> None:
        if key[0] == EpisodeKind.TRAIN.value:
            group = (key[1], key[2])
            self._members_done[group] = self._members_done.get(group, 0) + 1
            if self._members_done[group] == self.config.group_size:
                self.summary.tasks_done += 1
        if self._bar is None:
            return
        s = self.summary
        stats = (
            f"tasks {s.tasks_done}  reward {s.train_reward_mean:.3f}  ok {s.finished}  "
            f"agent-fail {s.agent_failures}  infra-fail {s.infra_failures}"
        )
        if self._eval_rounds:
            last = self._eval_rounds[-1]
            stats += f"  eval[{last}] {s.eval_reward_mean(last):.3f}"
        if s.resumed:
            stats += f"  resumed {s.resumed}"
        self._bar.update(self._bar_task, advance=1, stats=stats)

    # -- one slot ----------------------------------------------------------------------------------------
    async def _run_slot(self, slot: Slot, semaphore: asyncio.Semaphore) -> None:
        try:
            backoff = self.config.retry_backoff_s
            for attempt in range(self.config.infra_retries + 1):
                status, reward, episode_id, metrics = await self._attempt(slot)
                if status != "infra_failure" or attempt == self.config.infra_retries:
                    break
                await asyncio.sleep(backoff)
                backoff *= 2
            self._progress_log.record(slot.key, status, reward, episode_id, metrics)
            self._advance(slot.key)
            every = self.config.vote_every
            if every and self.summary.tasks_done >= self._voted_at + every:
                await self._vote()
            if self._infra_streak >= self.config.max_consecutive_infra:
                raise RunnerError(
                    f"{self._infra_streak} infrastructure failures in a row (last: task {slot.task.task_id}); "
                    "stopping: run the same command again to resume once the servers are back"
                )
        finally:
            semaphore.release()

    def _family(self, task: Task) -> str | None:
        family = task.data.get("family")
        return str(family) if isinstance(family, str) and family else self.config.family

    async def _attempt(self, slot: Slot) -> tuple[str, float | None, str | None, dict[str, float]]:
        """One episode of a slot → (status, reward, episode id of the first member, the workflow's
        ``Result.metrics`` of a finished episode)."""
        names = list(self.clients)
        episode = MultiEpisode(
            self.clients,
            slot.task.task_id,
            kind=slot.kind,
            family=self._family(slot.task),
            metadata={"member": slot.member, "round": slot.round, "task_index": slot.task.index},
            trainable_agents=self.config.trainable_agents,
            tenant=self.config.tenant,
        )
        try:
            await episode.begin()
        except ClientError as exc:
            if exc.status_code < 500 and exc.status_code != 429:
                raise RunnerError(f"the server refused a new episode: {exc}") from None
            return self._count_infra(slot, exc), None, None, {}
        except httpx.TransportError as exc:
            return self._count_infra(slot, exc), None, None, {}
        except ValidationError as exc:  # checked here before sending: a bad task id or family
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise RunnerError(f"task {slot.task.task_id[:60]!r}: {where}: {err['msg']}") from None
        first_id = episode[names[0]].id
        llm: Any = episode[names[0]].llm if len(names) == 1 else episode.llms
        try:
            output = await self._call_with_heartbeat(episode, slot, llm)
            rewards = _normalise(output, names)
        except Exception as exc:
            infra = classify_failure(exc, episode.base_urls) is FailureKind.INFRA
            await episode.abort(f"{type(exc).__name__}: {exc}"[:4000], infra_failure=infra)
            if infra:
                return self._count_infra(slot, exc), None, first_id, {}
            self.summary.agent_failures += 1
            self._show_traceback(slot, exc)
            return "aborted", None, first_id, {}
        except BaseException:
            await episode.abort("the runner stopped", infra_failure=True)
            raise
        try:
            await episode.finish(rewards)
        except PartialFinishError as exc:
            self.summary.partial_finishes += 1
            self.console.print(f"[yellow]task {slot.task.task_id}: {exc}[/]", highlight=False)
            return "partial_finish", None, first_id, {}
        except (MultiEpisodeError, ValueError) as exc:
            return self._count_infra(slot, exc, await self._server_reason(episode)), None, first_id, {}
        reward = _reward_of(rewards[names[0]] if isinstance(rewards, dict) else rewards)
        self.summary.finished += 1
        self._infra_streak = 0
        if slot.kind is EpisodeKind.TRAIN:
            self.summary.train_rewards.append(reward)
        else:
            self.summary.eval_rewards.setdefault(slot.round, []).append(reward)
        return "finished", reward, first_id, _metrics_of(rewards)

    def _count_infra(self, slot: Slot, exc: BaseException, why: str | None = None) -> str:
        self.summary.infra_failures += 1
        self._infra_streak += 1
        what = why or f"{type(exc).__name__}: {exc}"
        self.console.print(
            f"[yellow]infra failure[/] task {escape(slot.task.task_id)} member {slot.member}: {escape(what)}",
            highlight=False,
        )
        return "infra_failure"

    async def _server_reason(self, episode: MultiEpisode) -> str | None:
        """Why the server ended a member the client still held (a drain timeout, staleness, idling)."""
        for name in episode.names:
            try:
                view = await self.clients[name].get_episode(episode[name].id)
            except (ClientError, httpx.HTTPError):
                continue
            if view.status not in (EpisodeStatus.OPEN, EpisodeStatus.FINISHED) and view.reason:
                return f"the server ended episode {view.episode_id} ({view.status}): {view.reason}"
        return None

    def _show_traceback(self, slot: Slot, exc: BaseException) -> None:
        self.console.print(
            f"[bold red]workflow error[/] in task {slot.task.task_id} (member {slot.member}, "
            f"{slot.kind.value} round {slot.round}); episode aborted:",
            highlight=False,
        )
        self.console.print(Traceback.from_exception(type(exc), exc, exc.__traceback__, show_locals=False))

    async def _call_with_heartbeat(self, episode: MultiEpisode, slot: Slot, llm: Any) -> WorkflowOutput:
        """Await ``run(task, llm)`` while heartbeating; a lost episode cancels it with EpisodeLost."""
        work = asyncio.ensure_future(self.workflow(slot.task.data, llm))
        lost: list[EpisodeLost] = []

        async def beat() -> None:
            while True:
                await asyncio.sleep(self.config.heartbeat_s)
                try:
                    await episode.heartbeat()
                except EpisodeLost as exc:
                    lost.append(exc)
                    work.cancel()
                    return

        beater = asyncio.create_task(beat())
        limit = self.config.episode_timeout_s
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                return await work
        except TimeoutError as exc:
            if not deadline.expired():  # the workflow's own timeout: its error, unchanged
                raise
            raise TimeoutError(f"the workflow ran longer than the episode timeout ({limit:g} s)") from exc
        except asyncio.CancelledError:
            if lost and not _current_task_cancelling():
                raise lost[0] from None
            raise
        finally:
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater
            if not work.done():
                work.cancel()
                with contextlib.suppress(BaseException):
                    await work
            for one in llm.values() if isinstance(llm, dict) else (llm,):
                with contextlib.suppress(Exception):
                    await one.aclose()


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def run_workflow(
    workflow: WorkflowFn,
    servers: str | Mapping[str, str],
    dataset: TaskSet | str | Path,
    *,
    eval_dataset: TaskSet | str | Path | None = None,
    show_progress: bool = True,
    client_token: str | None = None,
    **config: Any,
) -> RunSummary:
    """Run ``workflow`` over ``dataset`` from a script (blocking; one event loop for the whole run).

    Args:
        workflow: ``async def run(task, llm)``.
        servers: one server URL, or name → URL for multi-model workflows.
        dataset: a :class:`TaskSet` or anything it accepts.
        eval_dataset: eval tasks (with ``eval_every=K``).
        show_progress: draw the progress bar.
        client_token: for servers started with client tokens (``swarm serve --client-token``).
        **config: :class:`RunnerConfig` fields (``group_size``, ``concurrency``, ``max_tasks``…).

    Returns:
        The run's counts and rewards.
    """
    urls = {"default": servers} if isinstance(servers, str) else dict(servers)
    cfg = RunnerConfig(**config)
    tasks = dataset if isinstance(dataset, TaskSet) else TaskSet(dataset)
    evals = eval_dataset if isinstance(eval_dataset, TaskSet | None) else TaskSet(eval_dataset)

    async def go() -> RunSummary:
        clients = {
            name: AsyncSwarmClient(
                url, client_id=cfg.client_id, client_token=client_token, retry=Runner.default_retry()
            )
            for name, url in urls.items()
        }
        try:
            runner = Runner(workflow, clients, tasks, cfg, eval_dataset=evals, show_progress=show_progress)
            return await runner.run()
        finally:
            for client in clients.values():
                await client.aclose()

    return asyncio.run(go())
