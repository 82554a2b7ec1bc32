"""Watching one run: the state of the watch (`RunWatch`), what one poll saw (`Observation`), the limits
(`WatchRules`) and the pure rule `judge` that decides whether the run goes on, and how it ended.

The rules, in the order they apply to each poll:

1. The server this run started exited (its status is unreachable) → *crashed*.
2. Progress: any change of (step, finished/aborted/open episodes, client records, last event, model
   calls) since the previous poll, or a started server using more than `BUSY_CPU_SHARE` of a core,
   moves the last-progress time to now. A new trainer step is reported (`Verdict.stepped`).
3. The step target is reached → *finished*.
4. The client exited: non-zero → *crashed*; zero without a step target → *finished*; zero with a
   target → *finished* ("tasks exhausted") once the server has been quiet for ``hang_after_s ×
   TRAINING_HANG_FACTOR`` while it trains, drains or holds pending episodes, else ``min(hang_after_s,
   60)``.
5. A live problem (early stop) while the client runs → *needs_attention*.
6. No progress for ``hang_after_s`` (× `TRAINING_HANG_FACTOR` while training or draining; at least
   `STARTUP_GRACE_S` until the client shows a first sign of life) → *hung*.
7. With a step target and no new step for ``hang_after_s`` while progress goes on → *slow*: reported
   once per step (`Verdict.slow_s`), not stopped.
8. The wall-time budget is spent → *budget*.

After the evaluation a3r reads the last step again (`final_end`): a run the budget stopped while its
last step was under way, and whose step then ended at the target, completed all its steps → *finished*,
not cancelled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from a3r.study.runs import RunStatusName

__all__ = [
    "BUSY_CPU_SHARE",
    "STARTUP_GRACE_S",
    "TRAINING_HANG_FACTOR",
    "Observation",
    "RunEnd",
    "RunWatch",
    "Verdict",
    "WatchRules",
    "final_end",
    "judge",
]

TRAINING_HANG_FACTOR = 5.0
"""While the server is training or draining (a step is under way, no event until it ends), a run is
hung only after ``TRAINING_HANG_FACTOR × hang_after_s`` without progress."""

STARTUP_GRACE_S = 60.0
"""Until a new client shows a first sign of progress, a run is hung only after this many seconds (or
``hang_after_s`` if longer): starting a client subprocess takes a while on a loaded machine."""

BUSY_CPU_SHARE = 0.2
"""A started server using more than this share of a core between two polls is computing (a long
generation or training step), which counts as progress: a slow run, not a hung one."""

_BUSY_STATES = ("training", "draining")


@dataclass(frozen=True)
class WatchRules:
    """The limits a run is watched under.

    Attributes:
        hang_after_s: Seconds without progress after which a run is hung (and without a trainer step
            after which it is slow).
        budget_s: Wall seconds the run may take, counted from `RunWatch.started`.
        target: Policy step at which training is done (``None``: no training target; the run ends with
            its client).
        early_stop: End the run when a live problem is observed while the client runs.
    """

    hang_after_s: float
    budget_s: float
    target: int | None = None
    early_stop: bool = False


@dataclass(frozen=True)
class Observation:
    """What one poll saw (plain values; counts from the server's status, the rest from files and
    ``/proc``).

    Attributes:
        now: Monotonic time of the poll, in seconds.
        client_exit: Exit code of the ``swarm run`` client, ``None`` while it runs.
        server_exit: Exit code of the server this run started, when its status was unreachable and it
            had exited; ``None`` otherwise.
        step: Policy step of the server; ``None`` when its status was unreachable.
        state: The server's state (``idle``, ``rolling``, ``draining``, ``training``, ``paused``) or
            ``None``.
        finished: Finished episodes on the server.
        aborted: Aborted episodes on the server (``None`` when not reported).
        open: Open episodes on the server (``None`` when not reported).
        pending: Finished episodes waiting for a trainer step.
        client_records: Episode records in the client's ``progress.jsonl``.
        event_seq: Sequence number of the last server event seen.
        model_calls: Model calls counted in the started server's access log.
        server_cpu_s: CPU seconds the started server has used (``None``: attached or unreadable).
        live_problem: Summary of a problem the live detectors see (early stop), or ``None``.
    """

    now: float
    client_exit: int | None = None
    server_exit: int | None = None
    step: int | None = None
    state: str | None = None
    finished: int = 0
    aborted: int | None = None
    open: int | None = None
    pending: int = 0
    client_records: int = 0
    event_seq: int = 0
    model_calls: int = 0
    server_cpu_s: float | None = None
    live_problem: str | None = None


@dataclass(frozen=True)
class RunWatch:
    """The state of a watch between polls (times are monotonic seconds).

    Attributes:
        started: When the run started (the budget counts from here).
        last_step: Policy step at the last poll.
        last_change: Time of the last progress.
        last_step_change: Time of the last new trainer step.
        last_poll: Time of the last poll (or of the start).
        last_cpu: CPU seconds of the started server at the last poll.
        signature: Progress counters at the last poll (``None`` before the first).
        alive_seen: The counters changed after the first poll at least once (the client started).
        slow_noted: The slow run was reported since the last new step.
    """

    started: float
    last_step: int
    last_change: float
    last_step_change: float
    last_poll: float
    last_cpu: float | None = None
    signature: tuple[object, ...] | None = None
    alive_seen: bool = False
    slow_noted: bool = False

    @classmethod
    def begin(cls, *, started: float, now: float, step: int, cpu_s: float | None) -> RunWatch:
        """A watch starting at ``now`` from policy step ``step``."""
        return cls(
            started=started,
            last_step=step,
            last_change=now,
            last_step_change=now,
            last_poll=now,
            last_cpu=cpu_s,
        )


@dataclass(frozen=True)
class RunEnd:
    """How a run ended: its status and one readable line."""

    status: RunStatusName
    reason: str


@dataclass(frozen=True)
class Verdict:
    """The judgement of one poll.

    Attributes:
        watch: The watch after this poll.
        end: How the run ended, or ``None`` while it goes on.
        stepped: The policy step changed at this poll (to ``watch.last_step``).
        slow_s: Seconds without a new trainer step while progress goes on, when the run turned slow at
            this poll (reported once per step); ``None`` otherwise.
    """

    watch: RunWatch
    end: RunEnd | None = None
    stepped: bool = False
    slow_s: float | None = None


def judge(watch: RunWatch, obs: Observation, rules: WatchRules) -> Verdict:
    """Apply the watch rules (module docstring) to one poll.

    Args:
        watch: The state after the previous poll.
        obs: What this poll saw.
        rules: The limits.

    Returns:
        The verdict, with the next watch state; no side effects.
    """
    if obs.server_exit is not None:
        return Verdict(watch, RunEnd("crashed", f"swarm server exited with code {obs.server_exit}"))
    now = obs.now
    step = watch.last_step if obs.step is None else obs.step
    signature = (
        step,
        obs.finished,
        obs.aborted,
        obs.open,
        obs.client_records,
        obs.event_seq,
        obs.model_calls,
    )
    alive_seen, last_change = watch.alive_seen, watch.last_change
    if signature != watch.signature:
        alive_seen = alive_seen or watch.signature is not None
        last_change = now
    computing = (
        obs.server_cpu_s is not None
        and watch.last_cpu is not None
        and now > watch.last_poll
        and (obs.server_cpu_s - watch.last_cpu) / (now - watch.last_poll) > BUSY_CPU_SHARE
    )
    if computing:
        last_change = now  # the server is computing: slow, not hung
    stepped = step != watch.last_step
    nxt = dataclasses.replace(
        watch,
        signature=signature,
        alive_seen=alive_seen,
        last_change=last_change,
        last_cpu=obs.server_cpu_s,
        last_poll=now,
    )
    if stepped:
        nxt = dataclasses.replace(nxt, last_step=step, last_step_change=now, slow_noted=False)

    quiet_s = now - nxt.last_change
    if rules.target is not None and step >= rules.target:
        return Verdict(nxt, RunEnd("finished", f"reached step {step}"), stepped)
    if obs.client_exit is not None:
        if obs.client_exit != 0:
            return Verdict(nxt, RunEnd("crashed", f"swarm run exited with code {obs.client_exit}"), stepped)
        if rules.target is None:
            return Verdict(nxt, RunEnd("finished", "client finished its tasks"), stepped)
        # The client is done; the server may still drain and train on what it pooled.
        waiting = obs.state in _BUSY_STATES or obs.pending + (obs.open or 0) > 0
        quiet_limit = rules.hang_after_s * TRAINING_HANG_FACTOR if waiting else min(rules.hang_after_s, 60.0)
        if quiet_s > quiet_limit:
            return Verdict(
                nxt, RunEnd("finished", f"tasks exhausted at step {step} (target {rules.target})"), stepped
            )
    if rules.early_stop and obs.client_exit is None and obs.live_problem is not None:
        return Verdict(nxt, RunEnd("needs_attention", obs.live_problem), stepped)
    hang_limit = rules.hang_after_s * (TRAINING_HANG_FACTOR if obs.state in _BUSY_STATES else 1.0)
    if not nxt.alive_seen:  # the client has not shown a sign of life yet: allow for its start-up
        hang_limit = max(hang_limit, STARTUP_GRACE_S)
    if quiet_s > hang_limit:
        reason = f"no progress (step {step}, {obs.finished} episodes, no event) for {quiet_s:.0f} s"
        return Verdict(nxt, RunEnd("hung", reason), stepped)
    slow_s: float | None = None
    if rules.target is not None and not nxt.slow_noted and now - nxt.last_step_change > rules.hang_after_s:
        slow_s = now - nxt.last_step_change
        nxt = dataclasses.replace(nxt, slow_noted=True)
    if now - nxt.started > rules.budget_s:
        reason = f"wall-time budget of {rules.budget_s:.0f} s spent at step {step}"
        return Verdict(nxt, RunEnd("budget", reason), stepped, slow_s)
    return Verdict(nxt, None, stepped, slow_s)


def final_end(end: RunEnd, *, last_step: int, target: int | None) -> RunEnd:
    """How a run ended, once the step under way at its end has ended too (read after the held-out
    evaluation): a budget stop whose run then reached its step ``target`` completed every step it was
    to train, so it is *finished* (its reason says the budget ran out during the last step); any other
    end stands.

    Args:
        end: The end `judge` gave.
        last_step: The last trainer step recorded after the evaluation.
        target: The policy step training was to reach (``None``: no step target).
    """
    if end.status == "budget" and target is not None and last_step >= target:
        return RunEnd(
            "finished",
            f"reached step {last_step}: all steps trained (the {end.reason.removeprefix('wall-time ')} "
            "while the last step was under way, which then ended)",
        )
    return end
