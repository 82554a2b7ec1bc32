"""The tracked ``spy`` benchmark at its smallest: the rendered who-is-the-spy template played by the real
embedded model through a real in-process server, recorded into a real store, judged and drawn."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import track
from track_history import Status, load_history

from memory import RunStatus, Store

PARTS = ("win_rate", "leak_rate", "invalid_vote_rate")


@pytest.mark.slow
@pytest.mark.usefixtures("torch_threads")
def test_spy_games_are_recorded_with_their_reward_parts_and_drawn(tmp_path: Path) -> None:
    settings = track.settings_from(
        track.QUICK, ["spy_games=2", "spy_describe_tokens=4", "spy_vote_tokens=3", "threads=1"]
    )
    bench = track.BY_NAME["spy"]
    with Store(tmp_path / "track.db") as store:
        new = track.run_suite(store, [bench], [1], settings, "quick")
        history = load_history(store)
        (run,) = history.runs["spy"]
        assert run.run.status is RunStatus.finished and new == {"spy": [run.run.id]}
        assert run.run.seed == 1 and run.run.config["settings"]["spy_games"] == 2
        final = run.run.final_metrics or {}
        assert set(final) >= {"reward_mean", *PARTS, "spy_won", "rounds", "calls", "wall_s"}
        # one round of 3 players: 3 descriptions, then 3 votes, in each of the 2 games
        assert final["calls"] == 12 and final["rounds"] == 1
        assert all(0.0 <= final[p] <= 1.0 for p in PARTS)
        # every agent trains (train_roles both): a game's win rate is 1/3 (the spy won) or 2/3
        assert final["win_rate"] == pytest.approx((2 - final["spy_won"]) / 3)
        rewards = [p.value for p in store.metric_history(run.run.id, bench.curve)]
        assert len(rewards) == 2 and all(-1.0 <= r <= 1.0 for r in rewards)
        assert final["reward_mean"] == pytest.approx(statistics.fmean(rewards))
        (verdict,) = track.verdicts(history, [bench], new, k=3.0, min_history=3)
        assert verdict.status is Status.no_history and verdict.metric == "reward_mean"
        from track_html import write_dashboard

        page = write_dashboard(tmp_path / "html", history, track.SUITE, [verdict], store).read_text()
    assert page.count("<svg") == 1 and "id='bench-spy'" in page
