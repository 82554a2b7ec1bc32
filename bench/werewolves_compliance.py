"""Can the embedded model play werewolves by the rules? Invalid actions per game, training off.

    python bench/werewolves_compliance.py [--games 4] [--seed 0] [--log replies.jsonl] [--temperature T]

One in-process swarm server (training off) with the embedded SmolLM2-135M-Instruct plays the default
werewolves game (``templates/werewolves``: 5 players, 2 days, the template's token limits and
temperature) ``--games`` times, all games at once. Every call carries a sampling seed derived from
(``--seed``, game, seat, call index), so a run is repeatable on the same prompts; a change of the
prompts or the parser is measured by running this before and after on the same seeds. Prints, per game,
the actions taken, the invalid ones (by kind of action) and the winner, then the mean ± std; ``--log``
writes every action's prompt (last user turn), reply and reading (one JSON object a line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from werewolves_teams import start

from swarm.client import AsyncSwarmClient
from swarm.config import ServerConfig, TrainingConfig
from templates.werewolves import data
from templates.werewolves.game import GameSetup, Phase, Role, play
from templates.werewolves.parsing import parse_target, parse_witch
from templates.werewolves.workflow import PARAMS


def _candidates(prompt: str) -> list[int]:
    """The seats a prompt offers (the digits after its last ':' up to the sentence's end)."""
    tail = prompt.rsplit(":", 1)[-1].split(".", 1)[0]
    return [int(t) for t in tail.replace(",", " ").split() if t.isdigit()]


def reading(setup: GameSetup, seat: int, phase: Phase, prompt: str, reply: str) -> str:
    """How the current parser reads one action reply: ``valid``, ``unparsed`` or ``not_allowed``."""
    if setup.role(seat) is Role.WITCH and phase is Phase.NIGHT:
        potions = prompt.split("Potions left:", 1)[-1].split(".", 1)[0]
        can_save = "save" in potions and "Nobody was attacked" not in prompt
        can_poison = "poison" in potions
        others = [s for s in setup.seats if s != seat]
        move = parse_witch(reply, can_save=can_save, can_poison=can_poison, allowed=others, seats=setup.seats)
        return "valid" if move.valid else "invalid"
    return parse_target(reply, _candidates(prompt), setup.seats).status.value


async def one_game(
    url: str, index: int, seed: int, log: list[dict[str, Any]], out: Path | None
) -> dict[str, Any]:
    task = data.make_task(index)
    setup = GameSetup.from_task(task)
    calls: Counter[int] = Counter()
    async with (
        AsyncSwarmClient(url, client_id="compliance") as client,
        client.episode(task["id"], kind="eval") as ep,
    ):
        openai = ep.llm.openai()

        def player(seat: int) -> Any:
            agent = setup.agent(seat)

            async def act(messages: list[dict[str, str]], phase: Phase) -> str:
                calls[seat] += 1
                limit = PARAMS["speak_max_tokens"] if phase is Phase.SPEAK else PARAMS["action_max_tokens"]
                response = await openai.chat.completions.create(
                    model=ep.llm.model,
                    messages=messages,
                    max_tokens=limit,
                    temperature=PARAMS["temperature"],
                    user=agent,
                    seed=seed * 1_000_000 + index * 10_000 + seat * 100 + calls[seat],
                )
                reply = response.choices[0].message.content or ""
                if phase is not Phase.SPEAK:
                    prompt = messages[-1]["content"].rsplit("\n\n", 1)[-1]
                    row = {
                        "game": index,
                        "seat": seat,
                        "agent": agent,
                        "phase": phase.value,
                        "prompt": prompt,
                        "reply": reply,
                        "reading": reading(setup, seat, phase, prompt, reply),
                    }
                    log.append(row)
                    if out is not None:  # as it happens: a run stopped early keeps its replies
                        with out.open("a", encoding="utf-8") as f:
                            f.write(json.dumps(row) + "\n")
                return reply

            return act

        started = time.perf_counter()
        record = await play(setup, {seat: player(seat) for seat in setup.seats})
        wall = time.perf_counter() - started
        await ep.finish(0.0)
    summary = {
        "game": index,
        "actions": sum(s.actions for s in record.stats.values()),
        "invalid": sum(s.invalid_actions for s in record.stats.values()),
        "reveals": sum(s.reveals for s in record.stats.values()),
        "winner": record.winner.value,
        "days": record.days,
        "calls": sum(calls.values()),
        "wall_s": wall,
    }
    Console().print(f"game {index}: {summary}")
    return summary


async def run_all(
    url: str, games: int, seed: int, log: list[dict[str, Any]], out: Path | None
) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(one_game(url, i, seed, log, out) for i in range(games))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: the template's)"
    )
    args = parser.parse_args()
    if args.temperature is not None:
        PARAMS["temperature"] = args.temperature
    server, thread, url = start(ServerConfig(port=0, training=TrainingConfig(enabled=False)))
    log: list[dict[str, Any]] = []
    if args.log:
        args.log.write_text("")
    started = time.perf_counter()
    try:
        games = asyncio.run(run_all(url, args.games, args.seed, log, args.log))
    finally:
        server.should_exit = True
        thread.join()
    wall = time.perf_counter() - started
    kinds = Counter(
        (row["agent"].rsplit("_", 1)[0], row["phase"]) for row in log if row["reading"] != "valid"
    )
    table = Table(
        title=f"werewolves, embedded SmolLM2-135M, training off, T={PARAMS['temperature']}, seed {args.seed}"
    )
    for col in ("game", "calls", "actions", "invalid", "reveals", "winner", "days", "game s"):
        table.add_column(col, justify="right")
    for g in games:
        table.add_row(
            *(str(g[k]) for k in ("game", "calls", "actions", "invalid", "reveals", "winner", "days")),
            f"{g['wall_s']:.0f}",
        )
    console = Console()
    console.print(table)
    invalid = [float(g["invalid"]) for g in games]
    spread = statistics.stdev(invalid) if len(invalid) > 1 else 0.0
    console.print(
        f"invalid actions per game {statistics.fmean(invalid):.2f} ± {spread:.2f} "
        f"({sum(g['invalid'] for g in games)} of {sum(g['actions'] for g in games)} actions); "
        f"by role and phase: {dict(kinds)}; {len(games)} games in {wall:.0f} s"
    )


if __name__ == "__main__":
    main()
