"""``bench/spy_pilots.py`` at its smallest: one variant's who-is-the-spy games played by the real embedded
model through a real in-process server, and the table's columns recomputed from the games' own record."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import spy_pilots


@pytest.mark.slow
@pytest.mark.usefixtures("torch_threads")
def test_one_variant_is_measured_from_real_games(tmp_path: Path) -> None:
    out = tmp_path / "pilots.json"
    (row,) = spy_pilots.main(
        ["--variants", "base", "--tasks", "1", "--group", "2", "--threads", "1", "--json", str(out),
         "--set", "max_rounds=1", "--set", "describe_max_tokens=4", "--set", "vote_max_tokens=3"]
    )  # fmt: skip
    # one round of 3 players in each of 2 games: 3 descriptions and 3 votes a game
    assert row.games == 2 and row.votes == 6 and row.descriptions == 6
    assert row.params["max_rounds"] == 1 and row.params["n_players"] == 3
    games = row.played
    assert len(games) == 2 and {g.task_id for g in games} == {games[0].task_id}
    assert all(g.votes == 3 and g.descriptions == 3 and len(g.vote_replies) == 3 for g in games)
    # the columns are the games' own counts
    invalid = sum(g.invalid_votes for g in games)
    assert invalid == sum(reply[1] != "valid" for g in games for reply in g.vote_replies)
    assert all(len(reply[3]) == 3 and reply[2] in reply[3] for g in games for reply in g.vote_replies)
    assert row.invalid_vote_rate.value == pytest.approx(invalid / 6)
    assert row.invalid_per_game.value == pytest.approx(statistics.fmean(g.invalid_votes / 3 for g in games))
    assert row.unread_vote_rate.value == pytest.approx(sum(g.unread_votes for g in games) / 6)
    assert row.leak_rate.value == pytest.approx(sum(g.leaks for g in games) / 6)
    assert row.spy_win_rate.value == pytest.approx(sum(g.spy_won for g in games) / 2)
    assert row.civilian_win_rate.value == pytest.approx(1 - row.spy_win_rate.value)
    assert row.reward.value == pytest.approx(statistics.fmean(g.reward for g in games))
    agents = sorted(games[0].agent_rewards)
    assert len(agents) == 3 and all(sorted(g.agent_rewards) == agents for g in games)
    stds = [statistics.pstdev(g.agent_rewards[a] for g in games) for a in agents]
    assert row.group_std == pytest.approx(statistics.fmean(stds))
    assert row.dead_pairs == pytest.approx(sum(s == 0 for s in stds) / 3)
    # the reward's inputs kept per agent give back the server's rewards, and the re-scoring at the
    # template's weights gives back the table's group std
    from templates.who_is_the_spy.reward import role_reward

    for g in games:
        assert {
            a: role_reward(won=w, leaks=lk, invalid_votes=iv) for a, (w, lk, iv) in g.agent_parts.items()
        } == (pytest.approx(g.agent_rewards))
    default = spy_pilots.reweighted([row])[0]
    assert (default["leak_penalty"], default["invalid_vote_penalty"]) == (0.5, 0.25)
    assert default["group_std"] == pytest.approx(row.group_std) and default["dead"] == pytest.approx(
        row.dead_pairs
    )
    for rate in (row.invalid_vote_rate, row.unread_vote_rate, row.leak_rate, row.spy_win_rate):
        assert 0.0 <= rate.low <= rate.value <= rate.high <= 1.0 and rate.high - rate.low > 0.1
    # the JSON holds the same row, with the raw votes
    payload = json.loads(out.read_text())
    assert payload["tasks"] == 1 and payload["group"] == 2 and payload["engine"] == "hf"
    (saved,) = payload["rows"]
    assert saved["invalid_vote_rate"]["value"] == pytest.approx(row.invalid_vote_rate.value)
    assert [r[0] for r in saved["played"][0]["vote_replies"]] == [r[0] for r in games[0].vote_replies]
    assert (len(row.invalid_examples) > 0) == (invalid > 0)
    # 3 descriptions of at most 4 tokens and 3 votes of at most 3 tokens a game, as the server recorded
    assert 0 < row.tokens_per_game <= 3 * 4 + 3 * 3
    assert row.seconds_per_game == pytest.approx(row.wall_s / 2)
