"""The server's state machine: the one owner of idle/rolling/draining/training/paused.

State machine (docs/ARCHITECTURE.md §State machine)::

    idle ──begin──► rolling ──batch ready──► draining ──open episodes ended / timeout──► training
                       ▲                                                                    │
                       └──────────────────────── step done (new weights) ◄──────────────────┘
    any state ──pause──► paused ──resume──► rolling

Asynchronous mode (``max_staleness`` set): no ``draining``; ``rolling ──batch ready──► training``, and
episodes are admitted during ``training`` too. A pause wins over a step under way: the step ends and
the server stays paused.

Each arrow is one method of `Phase`; an arrow the drawing lacks raises `IllegalTransition` (a bug in
the caller, never a client error). Nobody else writes the state.
"""

from __future__ import annotations

from swarm.protocol import EngineState


class IllegalTransition(RuntimeError):
    """A state change the state machine does not allow (a programming error, not a client's)."""


class Phase:
    """Where the server is in its rollout/train cycle, and who may begin an episode now.

    Args:
        asynchronous: asynchronous training (``TrainingConfig.max_staleness`` set): steps start without
            draining and episodes are admitted while one runs. Fixed for the server's life.
    """

    def __init__(self, *, asynchronous: bool = False) -> None:
        self.asynchronous = asynchronous
        self._state = EngineState.IDLE

    @property
    def state(self) -> EngineState:
        return self._state

    def admits(self) -> bool:
        """Whether an episode (of any kind) may begin now: not while paused, and in synchronous mode not
        while draining or training."""
        if self._state is EngineState.PAUSED:
            return False
        return self.asynchronous or self._state not in (EngineState.DRAINING, EngineState.TRAINING)

    def _refuse(self, what: str) -> IllegalTransition:
        mode = "asynchronous" if self.asynchronous else "synchronous"
        return IllegalTransition(f"{what} is not allowed from {self._state.value} ({mode} mode)")

    def _move(self, allowed: tuple[EngineState, ...], to: EngineState, what: str) -> None:
        if self._state not in allowed:
            raise self._refuse(what)
        self._state = to

    # -- transitions -------------------------------------------------------------------------------------
    def episode_begun(self) -> None:
        """An admitted episode began: ``idle → rolling`` (other admitting states are kept).

        Raises:
            IllegalTransition: the phase does not admit episodes now (see :meth:`admits`).
        """
        if not self.admits():
            raise self._refuse("beginning an episode")
        if self._state is EngineState.IDLE:
            self._state = EngineState.ROLLING

    def drain(self) -> None:
        """A batch is ready (synchronous mode): ``idle | rolling → draining``.

        Raises:
            IllegalTransition: asynchronous mode, or another state.
        """
        allowed = () if self.asynchronous else (EngineState.IDLE, EngineState.ROLLING)
        self._move(allowed, EngineState.DRAINING, "draining")

    def train(self) -> None:
        """A step starts: ``draining → training`` (synchronous) or ``idle | rolling → training``
        (asynchronous).

        Raises:
            IllegalTransition: another state (a pause while draining cancels the step).
        """
        allowed = (EngineState.IDLE, EngineState.ROLLING) if self.asynchronous else (EngineState.DRAINING,)
        self._move(allowed, EngineState.TRAINING, "training")

    def end_step(self) -> None:
        """The step is over (done, failed, or no batch after all): ``draining | training → rolling``.

        ``paused`` stays paused (the pause came during the step), ``idle`` and ``rolling`` are kept.
        """
        if self._state in (EngineState.DRAINING, EngineState.TRAINING):
            self._state = EngineState.ROLLING

    def pause(self) -> None:
        """``any state → paused``: no new episodes and no new step until :meth:`resume`."""
        self._state = EngineState.PAUSED

    def resume(self) -> bool:
        """``paused → rolling``; returns whether the server was paused (otherwise nothing changes)."""
        if self._state is not EngineState.PAUSED:
            return False
        self._state = EngineState.ROLLING
        return True
