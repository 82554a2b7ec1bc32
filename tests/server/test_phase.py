"""The server's state machine: legal and illegal transitions, and who may begin an episode when."""

from __future__ import annotations

import pytest

from swarm.protocol import EngineState
from swarm.server.phase import IllegalTransition, Phase


def test_a_synchronous_cycle_drains_trains_and_rolls_again() -> None:
    phase = Phase()
    assert phase.state is EngineState.IDLE and phase.admits()
    phase.episode_begun()
    assert phase.state is EngineState.ROLLING and phase.admits()
    phase.drain()
    assert phase.state is EngineState.DRAINING and not phase.admits()
    phase.train()
    assert phase.state is EngineState.TRAINING and not phase.admits()
    phase.end_step()
    assert phase.state is EngineState.ROLLING and phase.admits()


def test_an_asynchronous_step_starts_without_draining_and_admits_meanwhile() -> None:
    phase = Phase(asynchronous=True)
    phase.episode_begun()
    phase.train()
    assert phase.state is EngineState.TRAINING and phase.admits()
    phase.episode_begun()  # admitted while the step runs
    assert phase.state is EngineState.TRAINING
    phase.end_step()
    assert phase.state is EngineState.ROLLING


def test_pooled_episodes_may_train_from_idle() -> None:
    sync, asynchronous = Phase(), Phase(asynchronous=True)
    sync.drain()  # a restart with a ready batch in the pool
    assert sync.state is EngineState.DRAINING
    asynchronous.train()
    assert asynchronous.state is EngineState.TRAINING


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_pause_refuses_episodes_and_steps_until_resumed(asynchronous: bool) -> None:
    phase = Phase(asynchronous=asynchronous)
    phase.episode_begun()
    phase.pause()
    assert phase.state is EngineState.PAUSED and not phase.admits()
    with pytest.raises(IllegalTransition, match="from paused"):
        phase.train()
    with pytest.raises(IllegalTransition, match="beginning an episode"):
        phase.episode_begun()
    assert phase.resume() is True
    assert phase.state is EngineState.ROLLING and phase.admits()
    assert phase.resume() is False  # not paused: nothing changes
    assert phase.state is EngineState.ROLLING


def test_a_pause_during_a_step_outlasts_it() -> None:
    phase = Phase()
    phase.drain()
    phase.train()
    phase.pause()
    phase.end_step()
    assert phase.state is EngineState.PAUSED


def test_a_pause_while_draining_cancels_the_step() -> None:
    phase = Phase()
    phase.drain()
    phase.pause()
    with pytest.raises(IllegalTransition):
        phase.train()


def test_end_step_without_a_step_keeps_the_state() -> None:
    idle, rolling = Phase(), Phase()
    rolling.episode_begun()
    idle.end_step()
    rolling.end_step()
    assert (idle.state, rolling.state) == (EngineState.IDLE, EngineState.ROLLING)


def test_illegal_transitions_raise() -> None:
    sync = Phase()
    with pytest.raises(IllegalTransition, match="training is not allowed from idle"):
        sync.train()  # synchronous steps start from draining only
    sync.drain()
    with pytest.raises(IllegalTransition, match="draining is not allowed from draining"):
        sync.drain()
    with pytest.raises(IllegalTransition, match="beginning an episode"):
        sync.episode_begun()  # not admitted while draining
    sync.train()
    with pytest.raises(IllegalTransition):
        sync.train()
    with pytest.raises(IllegalTransition):
        sync.episode_begun()

    asynchronous = Phase(asynchronous=True)
    with pytest.raises(IllegalTransition, match="asynchronous"):
        asynchronous.drain()  # asynchronous mode never drains
    asynchronous.train()
    with pytest.raises(IllegalTransition):
        asynchronous.train()
