"""A research session: one graph thread with its store, provider, checkpointer and run context.

Used by ``a3r vibe``, ``a3r research`` and ``a3r resume`` (and by the TUI through a decision hook).
`Session.start` launches a thread, `Session.resume` continues one (after an interrupt, with a patch
decision; after a crash, with none). Both return a `Step`: finished (conclusion and report) or waiting
for a patch decision (the `PatchReview`).

The session's settings (`SessionSettings`, no secrets) are recorded per thread in the ledger, so a
resumed thread runs with the settings it started with unless the caller overrides them. API keys come
from the environment at every start and are never written anywhere.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field, field_validator

from a3r.errors import ThreadNotFound
from a3r.graph import Ledger, PatchReview, RunContext, build_graph, open_checkpointer
from a3r.providers import ProviderConfig, ProviderKind, make_provider
from a3r.study.headline import conclusion_line
from a3r.study.research import MAX_EVAL_TASKS
from a3r.swarmops.tenancy import TenantSettings
from memory import PatchStatus, Store

__all__ = ["Session", "SessionSettings", "Step", "open_session"]


class SessionSettings(BaseModel):
    """Settings of a thread (recorded with it; never holds a secret).

    Attributes:
        store: Store path or URL.
        root: Folder of checkpoints and study workspaces.
        provider: Provider kind.
        provider_model: Provider model name.
        base_url: Provider endpoint.
        model: ``swarm serve --model`` (``None``: embedded).
        server_url: Attach to this swarm server (vibe).
        auto_approve: Approve patches without asking.
        budget_minutes: Wall-time budget of the thread.
        hang_after_s: Seconds without progress that make a run hung.
        eval_tasks: Held-out tasks per evaluation.
        eval_samples: Attempts per held-out task.
        max_patches: Patches per thread at most.
        server_options: Extra ``swarm serve`` options (e.g. ``{"max-batch-size": 16}``).
        tenants: Run a sweep stage's LoRA runs side by side as tenants of one server (``a3r research
            --tenants``); ``False``: one server per run; ``None`` (the default): tenants on the vLLM
            engine only (`a3r.swarmops.tenancy.tenants_on`).
        max_tenants: Tenants resident on a stage's server at once (the memory cap); more runs wait.
    """

    model_config = ConfigDict(extra="forbid")

    store: str = ".a3r/memory.db"
    root: Path = Path(".a3r")
    provider: ProviderKind = ProviderKind.offline
    provider_model: str | None = None
    base_url: str | None = None
    model: str | None = None
    server_url: str | None = None
    auto_approve: bool = False
    budget_minutes: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    hang_after_s: float = Field(default=180.0, gt=0, allow_inf_nan=False)
    eval_tasks: int = Field(default=16, ge=1, le=MAX_EVAL_TASKS)
    eval_samples: int = Field(default=2, ge=1)
    max_patches: int = Field(default=2, ge=0)
    server_options: dict[str, Any] = Field(default_factory=dict)
    tenants: bool | None = None
    max_tenants: int = Field(default=8, ge=1, le=64)

    @field_validator("root")
    @classmethod
    def _absolute_root(cls, root: Path) -> Path:
        # Subprocesses (swarm serve / swarm run / evaluation) run with other working directories:
        # every path handed to them must be absolute.
        return root.expanduser().resolve()

    @field_validator("store")
    @classmethod
    def _absolute_store(cls, store: str) -> str:
        return store if "://" in store else str(Path(store).expanduser().resolve())


class Step(BaseModel):
    """Where a thread stands after an invocation.

    Attributes:
        thread_id: The thread.
        status: ``done`` or ``waiting`` (a patch awaits a decision).
        review: The patch awaiting a decision.
        conclusion: The study's conclusion (done).
        verdict: Its one plain line (`a3r.study.headline.conclusion_line`), printed before it (done).
        report: Path of the Markdown report (done).
        study_id: The thread's study.
    """

    thread_id: str
    status: Literal["done", "waiting"]
    review: PatchReview | None = None
    conclusion: str | None = None
    verdict: str | None = None
    report: str | None = None
    study_id: int | None = None

    @property
    def stopped(self) -> bool:
        """The thread ended without reaching its goal (a run failed to start or crashed, the code failed
        validation, nothing fits the budget): the graph's conclusions then begin with ``stopped:``."""
        return self.status == "done" and (self.conclusion or "").startswith("stopped:")


class Session:
    """One thread of the research graph (see module docstring); use `open_session`."""

    def __init__(
        self, settings: SessionSettings, thread_id: str, notify: Callable[[str], None] | None
    ) -> None:
        self.settings = settings
        self.thread_id = thread_id
        root = settings.root
        root.mkdir(parents=True, exist_ok=True)
        self._checkpointer = open_checkpointer(root / "checkpoints.db")
        self.ledger = Ledger(root / "checkpoints.db")
        self.store = Store(settings.store)
        provider_config = ProviderConfig.from_env(
            settings.provider, model=settings.provider_model, base_url=settings.base_url
        )
        import os

        self.context = RunContext(
            store=self.store,
            provider=make_provider(provider_config),
            ledger=self.ledger,
            thread_id=thread_id,
            root=root,
            model=settings.model,
            server_url=settings.server_url,
            admin_token=os.environ.get("SWARM_ADMIN_TOKEN") if settings.server_url else None,
            auto_approve=settings.auto_approve,
            budget_s=settings.budget_minutes * 60.0,
            hang_after_s=settings.hang_after_s,
            eval_tasks=settings.eval_tasks,
            eval_samples=settings.eval_samples,
            max_patches=settings.max_patches,
            server_options=dict(settings.server_options),
            notify=notify,
            tenants=TenantSettings(enabled=settings.tenants, max_tenants=settings.max_tenants),
        )
        self.graph = build_graph(self._checkpointer)
        self._lock = threading.Lock()

    @property
    def _config(self) -> RunnableConfig:
        return {"configurable": {"thread_id": self.thread_id}, "recursion_limit": 500}

    def _invoke(self, value: Any, *, since: float | None = None) -> Step:
        """Run the graph to its next stop; the thread's time counts from ``since`` (`time.monotonic`:
        the command's start), else from now, so a wait for a decision or before a resume is not counted."""
        with self._lock:
            self.context.clock_mark = time.monotonic() if since is None else min(since, time.monotonic())
            self.graph.invoke(value, self._config, context=self.context, durability="sync")
            return self.step()

    def step(self) -> Step:
        """The thread's current position (from its last checkpoint)."""
        snapshot = self.graph.get_state(self._config)
        values = snapshot.values or {}
        review = None
        for task in snapshot.tasks:
            for item in task.interrupts:
                if isinstance(item.value, PatchReview):
                    review = item.value
        waiting = review is not None
        conclusion, study_id = values.get("conclusion"), values.get("study_id")
        return Step(
            thread_id=self.thread_id,
            status="waiting" if waiting else "done",
            review=review,
            conclusion=conclusion,
            verdict=self._verdict(conclusion, study_id) if not waiting else None,
            report=values.get("report"),
            study_id=study_id,
        )

    def _verdict(self, conclusion: str | None, study_id: int | None) -> str | None:
        """The one plain line of the study's conclusion, from its finding in the store."""
        if not conclusion or study_id is None:
            return None
        study = self.store.get_study(study_id)
        findings = self.store.findings(study_id)
        return conclusion_line(conclusion, findings, question=study.question, kind=study.kind)

    def exists(self) -> bool:
        """Whether the checkpointer knows this thread."""
        return bool(self.graph.get_state(self._config).values)

    def start(
        self,
        request: str,
        *,
        mode: Literal["vibe", "research"],
        force: bool = False,
        overrides: dict[str, Any] | None = None,
        started_at: float | None = None,
    ) -> Step:
        """Launch the thread on ``request``; returns when it ends or waits for a patch decision.
        ``started_at`` (`time.monotonic`): when the command began, from which the budget counts (its
        start-up included); default now."""
        self.ledger.put(f"{self.thread_id}:session", self.settings.model_dump(mode="json"))
        return self._invoke(
            {"request": request, "mode": mode, "force": force, "overrides": overrides or {}}, since=started_at
        )

    def resume(self, decision: Any = None, *, started_at: float | None = None) -> Step:
        """Continue the thread: with a patch decision (``"approve"``, ``"reject"``, a mapping) when it
        waits for one, else from its last checkpoint (after a crash). ``started_at``: as for `start`.

        Raises:
            ThreadNotFound: The checkpointer has no such thread.
        """
        if not self.exists():
            raise ThreadNotFound(
                f"no checkpoint for thread {self.thread_id!r} in {self.settings.root / 'checkpoints.db'}"
            )
        if decision is not None and self.step().status == "waiting":
            return self._invoke(Command(resume=decision), since=started_at)
        return self._invoke(None, since=started_at)

    def wait_for_store_decision(
        self, review: PatchReview, *, poll_s: float = 2.0, timeout_s: float | None = None
    ) -> Step:
        """Poll the store until the patch is decided elsewhere (e.g. in ``a3r tui``), then resume with it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            patch = self.store.get_patch(review.patch_id)
            if patch.status is not PatchStatus.pending:
                approved = patch.status in (PatchStatus.approved, PatchStatus.applied)
                return self.resume(
                    {"approved": approved, "note": patch.note, "by": patch.decided_by or "store"}
                )
            if deadline is not None and time.monotonic() > deadline:
                return self.step()
            time.sleep(poll_s)

    def close(self) -> None:
        """Stop servers this session started and close its connections."""
        self.context.close_servers()
        self.store.close()
        self.ledger.close()
        self._checkpointer.conn.close()


def recorded_settings(root: Path, thread_id: str) -> SessionSettings | None:
    """The settings a thread was started with (``None`` if unknown)."""
    path = root / "checkpoints.db"
    if not path.exists():
        return None
    ledger = Ledger(path)
    try:
        found = ledger.get(f"{thread_id}:session")
    finally:
        ledger.close()
    return None if found is None else SessionSettings.model_validate(found)


@contextmanager
def open_session(
    settings: SessionSettings, *, thread_id: str | None = None, notify: Callable[[str], None] | None = None
) -> Iterator[Session]:
    """A session on a new (``thread_id=None``) or existing thread; closed on exit."""
    session = Session(settings, thread_id or f"t-{uuid.uuid4().hex[:12]}", notify)
    try:
        yield session
    finally:
        session.close()
