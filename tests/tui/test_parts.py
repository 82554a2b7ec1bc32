"""The TUI's parts on their own: evidence citations, SSE parsing, reward-metric choice, token
sequences of unmerged calls, the reward curve widget, settings validation."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError
from textual.app import App, ComposeResult
from textual.widgets import Label, Sparkline

from a3r.app.tui import (
    HFDetokenizer,
    PatchEvidence,
    RewardCurve,
    TuiConfig,
    cited_episodes,
    cited_runs,
    gather_evidence,
    token_sequences,
)
from a3r.app.tui._approvals_screen import age_text
from a3r.app.tui._episode_screen import episode_pieces
from a3r.app.tui._evidence import cited_metrics
from a3r.app.tui._metric_names import reward_history, reward_metric
from a3r.app.tui._swarm import LiveRun
from a3r.app.tui._token_view import TokenView
from memory import Store
from swarm.client._sse import parse_sse
from swarm.protocol import EpisodeKind, EpisodeStatus, EpisodeView
from swarm.tracking.records import CallRecord, FinishReason
from tests.tui.conftest import EPISODE_CITED, Seeded


@pytest.mark.parametrize(
    ("text", "runs"),
    [
        ("Run 3 collapsed; run #4 too.", [3, 4]),
        ("runs 3, 4 and 5 (and run 3 again)", [3, 4, 5]),
        ("Runs #7 & #8 or 9", [7, 8, 9]),
        ("rerun 3 times; 12 runs overall", []),
        ("no runs cited", []),
    ],
)
def test_cited_runs(text: str, runs: list[int]) -> None:
    assert cited_runs(text) == runs


def test_cited_episodes_and_metrics() -> None:
    text = f"see {EPISODE_CITED}, ep-0123456789abcdef and {EPISODE_CITED}; not ep-xyz nor ep-12ab"
    assert cited_episodes(text) == [EPISODE_CITED, "ep-0123456789abcdef"]
    names = ["reward/mean", "reward", "kl", "kl_coef", "loss"]
    assert cited_metrics("reward/mean fell while kl rose; kl_coef unchanged", names) == [
        "reward/mean",
        "kl",
        "kl_coef",
    ]


def test_gather_evidence_resolves_runs_and_servers(store: Store, seeded: Seeded) -> None:
    patch = store.get_patch(seeded.patch_id)
    evidence = gather_evidence(store, patch)
    assert [run.id for run in evidence.runs] == [seeded.run_ids[1], seeded.run_ids[0]]
    assert evidence.metrics == ("reward/mean",)
    assert evidence.episodes == (EPISODE_CITED,)
    assert evidence.server_url is None  # no seeded run recorded a server
    artifact = store.latest_artifact(seeded.study_id, "reward.py")
    assert artifact is not None
    stray = store.propose_patch(artifact.id, diff="-a\n+b\n", rationale="as run 999 shows")
    assert gather_evidence(store, stray) == PatchEvidence(missing_runs=(999,))
    experiment = store.experiments(seeded.study_id)[0]
    store.start_run(experiment.id, server_url="http://127.0.0.1:9/")
    assert gather_evidence(store, stray).server_url == "http://127.0.0.1:9/"


def test_parse_sse() -> None:
    body = (
        ": keep-alive\n\n"
        'event: episode.finished\nid: 3\ndata: {"seq": 3, "kind": "episode.finished"}\n\n'
        "data: not json\n\n"
        'data: {"seq": 4,\ndata: "kind": "x"}\n\n'
        "data: [1, 2]\n\n"
        'data: {"seq": 5}'
    )
    assert parse_sse(body) == [{"seq": 3, "kind": "episode.finished"}, {"seq": 4, "kind": "x"}, {"seq": 5}]


def test_live_series_skips_missing_values() -> None:
    live = LiveRun(
        metrics=[{"step": 1, "reward_mean": 0.5}, {"step": 2}, {"step": 3, "reward_mean": 1, "x": True}]
    )
    assert live.series("reward_mean") == [0.5, 1.0]
    assert live.series("x") == []
    assert LiveRun().series("reward_mean") == []


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (["kl", "reward/mean", "reward_mean"], "reward/mean"),
        (["kl", "reward_mean"], "reward_mean"),
        (["kl", "my_reward_avg"], "my_reward_avg"),
        (["loss", "kl"], "kl"),
        ([], None),
    ],
)
def test_reward_metric(names: list[str], chosen: str | None) -> None:
    assert reward_metric(names) == chosen


def test_age_text() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    assert [age_text(now - timedelta(seconds=s), now) for s in (-5, 42, 300, 7200, 3 * 86400)] == [
        "0s",
        "42s",
        "5m",
        "2h",
        "3d",
    ]


def _train_episode(episode_id: str, status: EpisodeStatus, calls: list[Any], **more: Any) -> EpisodeView:
    """A train episode of task ``t`` by client ``c`` with ``calls`` (and ``more`` fields)."""
    return EpisodeView(
        episode_id=episode_id,
        task_id="t",
        client_id="c",
        kind=EpisodeKind.TRAIN,
        status=status,
        created_at=0.0,
        calls=calls,
        **more,
    )


def _open_episode() -> EpisodeView:
    calls = [
        CallRecord(
            index=0,
            prompt_ids=[1, 2, 3],
            completion_ids=[4, 5],
            logprobs=[-0.1, -0.2],
            finish_reason=FinishReason.STOP,
        ),
        CallRecord(
            index=1,
            agent="critic",
            trainable=False,
            prompt_ids=[1, 2, 3, 4, 5, 6],
            completion_ids=[7],
            logprobs=[-0.3],
            finish_reason=FinishReason.LENGTH,
        ),
    ]
    return _train_episode("ep-00", EpisodeStatus.OPEN, calls)


def test_unmerged_calls_are_shown_call_by_call() -> None:
    episode = _open_episode()
    pieces = episode_pieces(episode, None)
    assert pieces == {i: f"⟨{i}⟩" for i in range(1, 8)}
    first, second = token_sequences(episode, pieces)
    assert first.loss_mask == (0, 0, 0, 1, 1) and first.trained == 2
    assert first.logprobs == (0.0, 0.0, 0.0, -0.1, -0.2)
    # A non-trainable agent's completion is context only.
    assert second.loss_mask == (0,) * 7 and second.trained == 0
    assert "agent critic" in second.title and "length" in second.title


def test_detokenizer_pieces_are_exact(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello world!\nHow are you?")
    pieces = HFDetokenizer.from_tokenizer(tokenizer)(ids)
    assert len(pieces) == len(ids) and "".join(pieces) == tokenizer.decode(ids)

    def short(ids: Any) -> list[str]:
        return ["x"]

    with pytest.raises(ValueError, match="1 pieces for 7 token ids"):
        episode_pieces(_open_episode(), short)


class _CurveApp(App[None]):
    def compose(self) -> ComposeResult:
        yield RewardCurve()


async def test_reward_curve_widget() -> None:
    app = _CurveApp()
    async with app.run_test(size=(40, 6)) as pilot:
        curve = app.query_one(RewardCurve)
        assert curve.title_text == "reward: no data yet"
        curve.show("reward/mean", [0.25, math.nan, 0.5, math.inf, 0.125])
        assert curve.values == (0.25, 0.5, 0.125)
        assert curve.title_text == "reward/mean  last 0.125  min 0.125  max 0.5  (3 steps)"
        assert list(app.query_one("#curve", Sparkline).data or []) == [0.25, 0.5, 0.125]
        # Found by a fresh user: one step of 0 was a full block (█), two steps of 0 the bottom line (▁).
        for values in ([0.0], [0.0, 0.0]):
            curve.show("reward", values)
            await pilot.pause()
            drawn = app.query_one("#curve", Sparkline).render_line(2).text
            assert set(drawn) == {"▁"}, drawn
        curve.show("a_long_metric_name/mean", [0.123456, 0.5])  # wider than the widget: an ellipsis
        await pilot.pause()
        assert app.query_one("#title", Label).render_line(0).text.rstrip().endswith("…")


def test_config_validation() -> None:
    config = TuiConfig.model_validate({"admin_token": "s3cret"})
    assert config.admin_token == SecretStr("s3cret")
    assert "s3cret" not in repr(config)
    for bad in ({"refresh_s": 0}, {"reviewer": ""}, {"event_tail": 0}, {"request_timeout_s": -1}):
        with pytest.raises(ValidationError):
            TuiConfig.model_validate(bad)


def test_reward_history(store: Store, seeded: Seeded) -> None:
    assert reward_history(store, seeded.run_ids[0]) == ("reward/mean", [0.1, 0.2, 0.35, 0.5])
    experiment = store.experiments(seeded.study_id)[0]
    other = store.start_run(experiment.id)
    assert reward_history(store, other.id) == ("reward", [])
    for step, value in enumerate([0.3, 0.1]):
        store.log_metrics(other.id, step=step, metrics={"loss": 1.0 - step, "task_reward_avg": value})
    assert reward_history(store, other.id) == ("task_reward_avg", [0.3, 0.1])


def test_tokens_show_ids_mask_and_logprob_bands() -> None:
    from a3r.app.tui._token_view import CURSOR_STYLE, LOGPROB_BANDS, render_tokens, token_line

    episode = _open_episode()
    first, _ = token_sequences(episode, episode_pieces(episode, None))
    assert first.ids == (1, 2, 3, 4, 5)
    assert [
        s.title.split(" (")[0] for s in token_sequences(episode, {i: "x" for i in range(1, 8)}, by="calls")
    ] == [
        "call 0",
        "call 1",
    ]
    sure = first.__class__(
        title="t", pieces=("a", "b", "c"), loss_mask=(0, 1, 1), logprobs=(0.0, -0.01, -3.0), ids=(7, 8, 9)
    )
    text = render_tokens(sure, cursor=2)
    styles = [str(span.style) for span in text.spans]
    assert LOGPROB_BANDS[0][2][1] in styles  # p 0.99: the surest band
    assert LOGPROB_BANDS[-1][2][0] in styles  # p 0.05: the least sure band
    assert CURSOR_STYLE in styles
    assert token_line(sure, 2).plain == "token 3/3 · id 9 · 'c' · trained · logprob -3.000 (p 0.050)"
    assert token_line(sure, 0).plain == "token 1/3 · id 7 · 'a' · context (not trained: no logprob)"


class _TokensApp(App[None]):
    def compose(self) -> ComposeResult:
        yield TokenView()


async def test_token_view_cursor_walks_the_tokens() -> None:
    episode = _open_episode()
    app = _TokensApp()
    async with app.run_test(size=(80, 12)) as pilot:
        view = app.query_one(TokenView)
        view.focus()
        view.show(token_sequences(episode, episode_pieces(episode, None)))
        await pilot.pause()
        await pilot.press("right", "right", "right")
        assert view.cursor == 3
        line = str(app.query_one("#token-line").render())
        assert "token 4/5 · id 4 · '⟨4⟩' · trained · logprob -0.100" in line
        await pilot.press("end")
        assert view.cursor == 4
        await pilot.press("right_square_bracket")  # the next sequence starts at its first token
        assert view.index == 1 and view.cursor == 0


def _distilled_episode() -> EpisodeView:
    """A finished episode whose one sample a teacher scored (on-policy distillation, issue 38)."""
    from swarm.tracking.records import Sample

    call = CallRecord(
        index=0,
        prompt_ids=[1, 2, 3],
        completion_ids=[4, 5],
        logprobs=[-0.1, -2.0],
        finish_reason=FinishReason.STOP,
        teacher_logprobs=[-0.5, -0.25],
    )
    sample = Sample(
        episode_id="ep-01",
        index=0,
        input_ids=[1, 2, 3, 4, 5],
        loss_mask=[0, 0, 0, 1, 1],
        behaviour_logprobs=[0.0, 0.0, 0.0, -0.1, -2.0],
        call_ids=[0, 0, 0, 0, 0],
        calls=[0],
        teacher_logprobs=[None, None, None, -0.5, -0.25],
    )
    return _train_episode("ep-01", EpisodeStatus.FINISHED, [call], samples=[sample])


async def test_token_view_shows_the_teachers_logprob_beside_the_students() -> None:
    episode = _distilled_episode()
    pieces = episode_pieces(episode, None)
    (sample,) = token_sequences(episode, pieces)
    assert sample.teacher_logprobs == (None, None, None, -0.5, -0.25) and sample.scored == 2
    (call,) = token_sequences(episode, pieces, by="calls")
    assert call.teacher_logprobs == sample.teacher_logprobs  # the calls view shows them too
    app = _TokensApp()
    async with app.run_test(size=(100, 14)) as pilot:
        view = app.query_one(TokenView)
        view.focus()
        view.show([sample])
        await pilot.pause()
        assert "teacher scored 2 tokens" in str(app.query_one("#token-head").render())
        await pilot.press("right", "right", "right")
        line = str(app.query_one("#token-line").render())
        assert (
            "token 4/5 · id 4 · '⟨4⟩' · trained · logprob -0.100 (p 0.905) · teacher -0.500 (p 0.607) · "
            "student − teacher +0.400" in line
        )
        await pilot.press("left")
        assert "teacher" not in str(app.query_one("#token-line").render())  # a context token: not scored
        await pilot.press("t")  # one token per row, both logprobs side by side
        assert view.rows
        rows = str(app.query_one("#token-body").render()).splitlines()
        assert rows[0].split() == ["#", "id", "piece", "mask", "student", "teacher", "s", "−", "t"]
        assert rows[5].split() == ["5", "5", "'⟨5⟩'", "1", "-2.000", "-0.250", "-1.750"]
        assert rows[1].split() == ["1", "1", "'⟨1⟩'", "0", "·", "·", "·"]
        await pilot.press("t")
        assert not view.rows
