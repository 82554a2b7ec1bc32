"""Pilot rollouts of who-is-the-spy: which template settings give a readable, learnable signal (issue 17).

No training: every game is an ``eval`` episode of the rendered template (``templates/who_is_the_spy``,
every role trainable, as ``a3r`` renders it) played through a real in-process swarm server (the app of
``swarm serve`` under uvicorn on loopback, as in ``bench/serve.py``), which loads the model itself
with ``--engine hf|vllm --device cpu|cuda`` and ``a3r``'s serving precision (``dtype auto``,
``mixed precision auto``: bf16 where the device has fast bf16 kernels).

**Grid.** Each variant changes one setting against ``base`` (the template's current defaults), so
each row reads as the effect of one change (:data:`GRID`):

* ``v0-prompt``: the vote instruction used before the pilots (the before/after of the prompt);
* ``vote16``: a larger vote token limit (does the limit cut votes before the number?);
* ``describe16``: a shorter description limit (cost; do shorter clues leak less?);
* ``temp0.7``: a lower temperature (fewer malformed replies, but less within-group variance);
* ``n4``: four players, one spy (a harder game for the spy, more votes per round);
* ``rounds1``: one round (half the calls of a game: faster steps; is the win still decided?).

A second table re-scores the same games with other reward weights (:func:`reweighted`): how much of
each group's reward spread the compliance part (penalties) carries, against the win part.

**Games.** A variant plays ``--tasks`` tasks (the template's data builder, data seed ``--seed``: word
pairs, seating and word swaps are fixed by seed and task index, the same tasks for every variant of
one game size) × ``--group`` games each (one GRPO group per task, as ``a3r`` trains). The workflow
sends no sampling seed, so replies vary between runs; the intervals carry that noise.

**Columns.** Rates pool counts over all games and seats, with 95 % Wilson intervals
(``scipy.stats.binomtest(...).proportion_ci(method="wilson")``; they treat votes as independent,
which votes of one game are not, so they are somewhat narrow):

* ``invalid``: invalid votes / votes (unreadable, self, or an eliminated/unknown player); ``unread``:
  the unreadable share alone; ``invalid/game``: the mean of each game's invalid share with a t-interval
  over games (wider, and the one to compare variants by: two runs of the same variant on CPU differed
  by more than the pooled Wilson intervals allow);
* ``leak``: descriptions saying their own word (or empty) / descriptions;
* ``spy win``: games the spy team won / games (the civilians won the rest);
* ``reward``: mean episode reward (mean over all agents of a game) ± 95 % t-interval over games;
* ``group std``: GRPO's signal: the std of each agent's reward within its group (same task, same
  agent, ``--group`` games), averaged over (task, agent) pairs; ``dead``: the share of (task, agent)
  pairs whose rewards are all equal (zero advantage: no gradient);
* ``tok/game``, ``s/game``: completion tokens the server recorded per game; wall seconds of the
  variant / games (games run ``--concurrency`` at a time).

Usage::

    .venv/bin/python bench/spy_pilots.py --smoke                    # ≈ 40 s on 2 shared CPU cores
    .venv/bin/python bench/spy_pilots.py --variants base,v0-prompt --tasks 6 --group 4 --concurrency 24 --threads 1
    python bench/spy_pilots.py --engine vllm --device cuda --tasks 32 --group 8 --concurrency 128 \\
        --json spy_pilots.json --png spy_pilots.png                  # the whole grid, H200
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from scipy.stats import binomtest
from scipy.stats import t as student_t
from serve import serve

from swarm.client import AsyncSwarmClient
from swarm.config import ServerConfig, TrainingConfig
from templates import get_template, render

V0_VOTE_PROMPT = (
    "Round {round} voting. Which player do you think is the spy? Living players you can vote for: "
    "{candidates}. Reply with the player number only."
)
"""The vote instruction before the pilots (issue 17), kept to measure the change against."""


@dataclass(frozen=True)
class Variant:
    """One pilot setting: template parameters plus the vote instruction."""

    name: str
    why: str
    """What the row tests."""
    vote_prompt: str | None = None
    """Vote instruction (``None``: the template's own ``game.VOTE_PROMPT``)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Template parameters that differ from the template's defaults."""


GRID: tuple[Variant, ...] = (
    Variant("base", "the template's current defaults"),
    Variant("v0-prompt", "the vote instruction before the pilots", vote_prompt=V0_VOTE_PROMPT),
    Variant("vote16", "vote token limit 16", params={"vote_max_tokens": 16}),
    Variant("describe16", "description token limit 16", params={"describe_max_tokens": 16}),
    Variant("temp0.7", "sampling temperature 0.7", params={"temperature": 0.7}),
    Variant("n4", "four players, one spy", params={"n_players": 4}),
    Variant("rounds1", "one round a game", params={"max_rounds": 1}),
)
BY_NAME = {v.name: v for v in GRID}
SMOKE_VARIANTS = ("base", "v0-prompt")


@dataclass
class Game:
    """What one played game left: its result and the server's record of it."""

    task_id: str
    agent_rewards: dict[str, float]
    reward: float
    spy_won: bool
    descriptions: int
    leaks: int
    votes: int
    invalid_votes: int
    unread_votes: int
    completion_tokens: int
    vote_replies: list[tuple[str, str, int, list[int]]]
    """(raw reply, status, voter, living seats) of every vote: enough to read it again with another parser."""
    agent_parts: dict[str, tuple[bool, int, int]] = field(default_factory=dict)
    """Per agent: (team won, leaks, invalid votes), the inputs of the reward (``reward.role_reward``)."""


@dataclass
class Interval:
    """A point estimate with its 95 % interval."""

    value: float
    low: float
    high: float

    def show(self, digits: int = 2) -> str:
        if math.isnan(self.value):
            return "–"
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def wilson(successes: int, trials: int) -> Interval:
    """Proportion with its 95 % Wilson score interval (NaN when there are no trials)."""
    if trials == 0:
        return Interval(math.nan, math.nan, math.nan)
    ci = binomtest(successes, trials).proportion_ci(0.95, method="wilson")
    return Interval(successes / trials, float(ci.low), float(ci.high))


def mean_interval(values: list[float]) -> Interval:
    """Mean with its 95 % Student t interval (zero width for a single value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, mean, mean)
    half = student_t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half)


@dataclass
class Row:
    """One variant's measurements (see the module docstring for each column)."""

    variant: str
    params: dict[str, Any]
    """Every template parameter of the variant (defaults resolved)."""
    vote_prompt: str
    games: int
    votes: int
    descriptions: int
    invalid_vote_rate: Interval
    invalid_per_game: Interval
    """Mean over games of each game's invalid-vote share, with a t-interval over games: votes of one game
    are not independent, so this interval is the honest one for comparing variants."""
    unread_vote_rate: Interval
    leak_rate: Interval
    spy_win_rate: Interval
    civilian_win_rate: Interval
    reward: Interval
    group_std: float
    """Mean over (task, agent) of the agent's reward std within its group."""
    dead_pairs: float
    """Share of (task, agent) pairs with zero reward std."""
    episode_group_std: float
    """Mean over tasks of the episode reward's std within the group."""
    tokens_per_game: float
    seconds_per_game: float
    wall_s: float
    invalid_examples: list[str]
    """Up to 12 distinct raw replies of invalid votes (most frequent first)."""
    played: list[Game] = field(default_factory=list)
    """The games themselves (for re-analysis from the JSON)."""


def summarise(variant: str, params: dict[str, Any], prompt: str, games: list[Game], wall_s: float) -> Row:
    """Aggregate a variant's games into a :class:`Row`."""
    votes = sum(g.votes for g in games)
    descriptions = sum(g.descriptions for g in games)
    spy_wins = sum(g.spy_won for g in games)
    groups: dict[str, list[Game]] = defaultdict(list)
    for g in games:
        groups[g.task_id].append(g)
    pair_stds = []
    episode_stds = []
    for members in groups.values():
        if len(members) < 2:
            continue
        episode_stds.append(statistics.pstdev(g.reward for g in members))
        for agent in members[0].agent_rewards:
            pair_stds.append(statistics.pstdev(g.agent_rewards[agent] for g in members))
    examples = Counter(reply[0] for g in games for reply in g.vote_replies if reply[1] != "valid")
    return Row(
        variant=variant,
        params=params,
        vote_prompt=prompt,
        games=len(games),
        votes=votes,
        descriptions=descriptions,
        invalid_vote_rate=wilson(sum(g.invalid_votes for g in games), votes),
        invalid_per_game=mean_interval([g.invalid_votes / g.votes for g in games if g.votes]),
        unread_vote_rate=wilson(sum(g.unread_votes for g in games), votes),
        leak_rate=wilson(sum(g.leaks for g in games), descriptions),
        spy_win_rate=wilson(spy_wins, len(games)),
        civilian_win_rate=wilson(len(games) - spy_wins, len(games)),
        reward=mean_interval([g.reward for g in games]),
        group_std=statistics.fmean(pair_stds) if pair_stds else math.nan,
        dead_pairs=sum(s == 0 for s in pair_stds) / len(pair_stds) if pair_stds else math.nan,
        episode_group_std=statistics.fmean(episode_stds) if episode_stds else math.nan,
        tokens_per_game=statistics.fmean(g.completion_tokens for g in games),
        seconds_per_game=wall_s / len(games),
        wall_s=wall_s,
        invalid_examples=[text for text, _ in examples.most_common(12)],
        played=games,
    )


def load_workflow(folder: Path, params: dict[str, Any], template: str = "who_is_the_spy") -> Any:
    """Render ``template`` with ``params`` into ``folder`` and import its workflow (a fresh module copy)."""
    rendered = render(template, params, folder)
    spec = importlib.util.spec_from_file_location(f"{template}_bench_{folder.name}", rendered.workflow)
    assert spec is not None and spec.loader is not None
    workflow = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workflow)
    workflow.tasks_path = rendered.tasks
    return workflow


async def play_variant(
    url: str, variant: Variant, base: dict[str, Any], tasks: int, group: int, concurrency: int, folder: Path
) -> Row:
    """Play ``tasks`` × ``group`` games of one variant as eval episodes; returns its row."""
    params = {**base, **variant.params, "n_tasks": tasks, "train_roles": "both"}
    workflow = load_workflow(folder / variant.name, params)
    game_module = workflow._game
    if variant.vote_prompt is not None:  # this rendered copy's own module: other variants keep theirs
        game_module.VOTE_PROMPT = variant.vote_prompt
    records: dict[str, Any] = {}
    votes: dict[str, list[tuple[str, str, int, list[int]]]] = defaultdict(list)
    play, parse_vote = game_module.play, game_module.parse_vote

    async def recorded_play(setup: Any, players: Any, **kwargs: Any) -> Any:
        record = await play(setup, players, **kwargs)
        records[_task_name()] = record
        return record

    def recorded_parse_vote(text: str, *, voter: int, alive: Any) -> Any:
        vote = parse_vote(text, voter=voter, alive=alive)
        votes[_task_name()].append((text, vote.status.value, voter, sorted(alive)))
        return vote

    game_module.play, game_module.parse_vote = recorded_play, recorded_parse_vote
    rows = [json.loads(line) for line in workflow.tasks_path.read_text(encoding="utf-8").splitlines()]
    limit = asyncio.Semaphore(concurrency)

    async def one(client: AsyncSwarmClient, task: dict[str, Any], k: int) -> Game:
        async with limit:
            name = f"{task['id']}#{k}"
            asyncio.current_task().set_name(name)  # type: ignore[union-attr]
            agents = workflow.trainable_agents(task)
            async with client.episode(task["id"], kind="eval", trainable_agents=agents) as ep:
                result = await workflow.run(task, ep.llm)
                await ep.finish(result)
            view = await client.get_episode(ep.id)
        record = records.pop(name)
        replies = votes.pop(name)
        stats = record.stats.values()
        return Game(
            task_id=task["id"],
            agent_rewards=dict(result.agent_rewards),
            agent_parts={
                record.setup.agent(seat): (record.won(seat), st.leaks, st.invalid_votes)
                for seat, st in record.stats.items()
            },
            reward=result.reward,
            spy_won=result.metrics["spy_won"] == 1.0,
            descriptions=sum(s.descriptions for s in stats),
            leaks=sum(s.leaks for s in stats),
            votes=sum(s.votes for s in stats),
            invalid_votes=sum(s.invalid_votes for s in stats),
            unread_votes=sum(reply[1] == "unparsed" for reply in replies),
            completion_tokens=sum(len(c.completion_ids) for c in view.calls),
            vote_replies=replies,
        )

    async with AsyncSwarmClient(url, client_id=f"pilot-{variant.name}") as client:
        started = time.perf_counter()
        games = await asyncio.gather(*(one(client, task, k) for task in rows for k in range(group)))
        wall = time.perf_counter() - started
    prompt = variant.vote_prompt or game_module.VOTE_PROMPT
    resolved = get_template("who_is_the_spy").resolve({**base, **variant.params})
    return summarise(variant.name, dict(resolved), prompt, list(games), wall)


def _task_name() -> str:
    task = asyncio.current_task()
    assert task is not None
    return task.get_name()


def print_table(rows: list[Row], title: str, console: Console) -> None:
    """The pilot table (one row per variant)."""
    table = Table(title=title)
    for col in (
        "variant", "games", "invalid", "invalid/game", "unread", "leak", "spy win", "civ win", "reward",
        "group std", "dead", "tok/game", "s/game",
    ):  # fmt: skip
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in rows:
        table.add_row(
            r.variant,
            str(r.games),
            r.invalid_vote_rate.show(),
            r.invalid_per_game.show(),
            r.unread_vote_rate.show(),
            r.leak_rate.show(),
            r.spy_win_rate.show(),
            r.civilian_win_rate.show(),
            r.reward.show(),
            f"{r.group_std:.3f}",
            f"{r.dead_pairs:.2f}",
            f"{r.tokens_per_game:.0f}",
            f"{r.seconds_per_game:.2f}",
        )
    console.print(table)


WEIGHTS: tuple[tuple[float, float], ...] = ((0.5, 0.25), (0.5, 0.5), (1.0, 0.5), (1.0, 1.0))
"""(leak_penalty, invalid_vote_penalty) pairs the games are re-scored with (the first: the template's)."""


def reweighted(rows: list[Row], weights: tuple[tuple[float, float], ...] = WEIGHTS) -> list[dict[str, Any]]:
    """Each variant's games re-scored with other reward weights (``reward.role_reward``, same games).

    Per (task, agent) group: the within-group reward std, and the share of the within-group variance
    that the compliance part (−penalties) carries: ``1 − Var(win)/Var(reward)`` clipped to [0, 1]
    (win and penalties are correlated within a game, so this is a share of the total, not a split).
    A weak player's wins are mostly chance, so the compliance share is the part of GRPO's advantage
    that rewards something the policy controls.
    """
    from templates.who_is_the_spy.reward import role_reward

    out = []
    for row in rows:
        groups: dict[str, list[Game]] = defaultdict(list)
        for g in row.played:
            groups[g.task_id].append(g)
        for leak_w, vote_w in weights:
            stds, shares = [], []
            for members in groups.values():
                if len(members) < 2:
                    continue
                for agent in members[0].agent_parts:
                    parts = [g.agent_parts[agent] for g in members]
                    total = [
                        role_reward(
                            won=w,
                            leaks=lk,
                            invalid_votes=iv,
                            leak_penalty=leak_w,
                            invalid_vote_penalty=vote_w,
                        )
                        for w, lk, iv in parts
                    ]
                    var = statistics.pvariance(total)
                    stds.append(math.sqrt(var))
                    if var > 0:
                        shares.append(
                            min(1.0, max(0.0, 1 - statistics.pvariance(float(w) for w, _, _ in parts) / var))
                        )
            out.append({
                "variant": row.variant,
                "leak_penalty": leak_w,
                "invalid_vote_penalty": vote_w,
                "group_std": statistics.fmean(stds) if stds else math.nan,
                "dead": sum(x == 0 for x in stds) / len(stds) if stds else math.nan,
                "compliance_share": statistics.fmean(shares) if shares else math.nan,
            })  # fmt: skip
    return out


def print_weights(table_rows: list[dict[str, Any]], console: Console) -> None:
    """The re-scored games (see :func:`reweighted`)."""
    table = Table(title="the same games under other reward weights (per (task, agent) group)")
    for col in ("variant", "leak pen.", "invalid pen.", "group std", "dead", "compliance share"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in table_rows:
        table.add_row(
            r["variant"], f"{r['leak_penalty']:g}", f"{r['invalid_vote_penalty']:g}", f"{r['group_std']:.3f}",
            f"{r['dead']:.2f}", f"{r['compliance_share']:.2f}",
        )  # fmt: skip
    console.print(table)


def draw(rows: list[Row], path: Path) -> None:
    """Rates with their intervals per variant, one panel per rate (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("invalid_vote_rate", "invalid-vote rate"),
        ("leak_rate", "leak rate"),
        ("spy_win_rate", "spy win rate"),
        ("reward", "episode reward"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 0.5 * len(rows) + 1.5), sharey=True)
    names = [r.variant for r in rows]
    for ax, (attr, label) in zip(axes, panels, strict=True):
        values = [getattr(r, attr) for r in rows]
        ys = range(len(rows))
        ax.errorbar(
            [v.value for v in values],
            ys,
            xerr=[[v.value - v.low for v in values], [v.high - v.value for v in values]],
            fmt="o",
            capsize=3,
        )
        ax.set_title(label)
        ax.set_yticks(list(ys), names)
        ax.grid(axis="x", alpha=0.3)
    axes[0].invert_yaxis()  # the first variant on top, as in the table
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--variants", default=",".join(v.name for v in GRID), help="comma-separated names")
    parser.add_argument("--tasks", type=int, default=4, help="tasks (GRPO groups) per variant")
    parser.add_argument("--group", type=int, default=4, help="games per task")
    parser.add_argument("--seed", type=int, default=0, help="data seed of the tasks")
    parser.add_argument("--concurrency", type=int, default=16, help="games at once")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="template parameter for every variant (JSON value), e.g. --set max_rounds=1")  # fmt: skip
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--mixed-precision", default="auto", choices=("auto", "bf16", "no"))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the server (cpu; use 1 on cores other jobs share)")  # fmt: skip
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"variants {SMOKE_VARIANTS}, 1 task x 2 games of 1 round, 1 thread",
    )
    parser.add_argument("--json", type=Path, help="write the rows (and examples of invalid votes) here")
    parser.add_argument("--png", type=Path, help="draw the rates with their intervals here")
    args = parser.parse_args(argv)
    names = list(SMOKE_VARIANTS) if args.smoke else [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; known: {list(BY_NAME)}")
    base: dict[str, Any] = {"seed": args.seed}
    if args.smoke:
        args.tasks, args.group = 1, 2
        args.threads = args.threads or 1
        base["max_rounds"] = 1
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            base[key] = json.loads(value)
        except json.JSONDecodeError:
            base[key] = value
    config = ServerConfig(
        port=0,
        engine=args.engine,
        device=args.device,
        dtype=args.dtype,
        mixed_precision=args.mixed_precision,
        torch_threads=args.threads,
        max_batch_size=64,
        training=TrainingConfig(enabled=False),
    )
    console = Console(width=None if sys.stdout.isatty() else 200)
    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="spy-pilots-") as tmp:
        folder = Path(tmp)
        with serve(None, folder / "run", config.model_copy(update={"run_dir": folder / "run"})) as url:
            for name in names:
                row = asyncio.run(
                    play_variant(url, BY_NAME[name], base, args.tasks, args.group, args.concurrency, folder)
                )
                console.print(
                    f"{name}: {row.games} games in {row.wall_s:.0f} s, invalid {row.invalid_vote_rate.show()}"
                )
                rows.append(row)
    title = (
        f"who-is-the-spy pilots: {args.tasks} tasks x {args.group} games per variant, data seed {args.seed}, "
        f"engine {args.engine} on {args.device}, {time.perf_counter() - started:.0f} s"
    )
    print_table(rows, title, console)
    weights = reweighted(rows)
    print_weights(weights, console)
    if args.json:
        payload = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "engine": args.engine,
            "device": args.device,
            "model": config.model or "embedded SmolLM2-135M-Instruct",
            "tasks": args.tasks,
            "group": args.group,
            "seed": args.seed,
            "rows": [asdict(r) for r in rows],
            "reweighted": weights,
        }
        args.json.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    if args.png:
        with contextlib.suppress(ImportError):
            draw(rows, args.png)
    return rows


if __name__ == "__main__":
    main()
