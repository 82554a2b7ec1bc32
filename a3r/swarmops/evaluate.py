"""Held-out evaluation client, run as a subprocess: ``python -m a3r.swarmops.evaluate WORKFLOW --server URL ...``.

Each task of the dataset is attempted ``--samples`` times as ``kind=eval`` episodes (recorded by the
server, never trained), at most ``--concurrency`` at once, each within ``--episode-timeout`` seconds.
Attempts start round-robin over the tasks (every task once, then every task a second time...), so any
prefix of them spreads over the tasks. One JSON line per ended attempt goes to ``--out`` in the client
runner's ``progress.jsonl`` format (``kind``, ``round``, ``task_id``, ``member``, ``status``,
``reward``, ``time``, plus ``order``, its place in the start order, and ``seconds``, how long it took),
so `a3r.study.analysis.read_progress` reads both. A failed attempt says what failed and after how long
(a time limit: which task and attempt, and the limit it ran past). The workflow is the frozen evaluator
copy of a study, not the patchable training workflow. With ``--tenant ID`` every attempt is begun under
that LoRA tenant (a server with ``--tenants``), so it samples the tenant's adapter.

With ``--stop-group-size G`` the evaluation is a preflight with a sequential futility test
(`a3r.study.sequential`): after every ended attempt the test looks at the longest prefix of attempts,
in start order, that have all ended, and once their successes (reward > 0) show the success rate is
below what GRPO groups of G need, the attempts under way are cancelled (their episodes aborted, not
recorded) and the evaluation ends. ``--summary`` receives one JSON object: attempts planned and ended,
failures, and the test's last `SignalCheck`.

With ``--time-budget S`` the whole evaluation ends within S wall seconds of the client's start: an
attempt's limit is the smaller of ``--episode-timeout`` and the time left of S when it begins, and an
attempt not begun by then never begins. An attempt stopped by that budget is *cut*: it counts as no
success (the futility test then assumes a cut attempt would not have succeeded), its record says so
(``"cut": true``), and the summary says how many were cut, after how long, and about how many tokens
they had decoded: the ended attempts' completion tokens are read from the server's record of their
episode, and a cut attempt's count is estimated at their median decoding rate (tokens per second of
an attempt's wall time; the server's static batches decode the attempts under way in step). It also
gives the test over the attempts that ended on their own alone (``uncut_signal``), so a verdict can
say whether it rests on the assumption about the cut ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _failure(
    exc: BaseException,
    *,
    task_id: str,
    member: int,
    seconds: float,
    limit_s: float,
    cut_by: float | None = None,
) -> str:
    """What failed in one attempt and after how long, in one line (≤ 500 characters); ``cut_by`` is the
    ``--time-budget`` that set this attempt's limit (``None``: the episode limit did)."""
    if isinstance(exc, TimeoutError) and seconds >= limit_s * 0.99 and cut_by is not None:
        return (
            f"cut: task {task_id} attempt {member} was cut after {seconds:.0f} s at the evaluation's "
            f"{cut_by:.0f} s time budget (--time-budget); it counts as no success"
        )
    if isinstance(exc, TimeoutError) and seconds >= limit_s * 0.99:
        return (
            f"TimeoutError: task {task_id} attempt {member} did not end within the {limit_s:g} s episode "
            f"limit (--episode-timeout)"
        )
    text = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {text} (task {task_id} attempt {member}, after {seconds:.0f} s)"[:500]


class _Evaluation:
    """One evaluation under way: its attempts in start order, what ended, the futility test's last look,
    and what the time budget cut.

    Attributes:
        order: ``(task, member)`` per attempt, round-robin over the tasks.
        succeeded: Per attempt: ``None`` while it has not ended, else whether it earned a reward > 0.
        failures: Attempts that failed (time limit, error, cut).
        check: The sequential test's last look (``None``: no test, or no look yet).
        inside: Attempts inside their episode block (cancelled when the test stops the evaluation).
        deadline: When the ``--time-budget`` ends (`time.monotonic`; ``None``: no budget).
        cut: Wall seconds of each cut attempt.
        rates: Completion tokens per wall second of each ended attempt (with ``--time-budget``).
        uncut: Successes of the attempts that ended on their own.
        not_begun: Attempts the time budget left unbegun.
    """

    def __init__(self, args: argparse.Namespace, tasks: list[Any], run: Any) -> None:
        from a3r.study.sequential import SignalCheck, SignalRule

        self.args, self.run = args, run
        self.order = [(task, member) for member in range(args.samples) for task in tasks]
        self.succeeded: list[bool | None] = [None] * len(self.order)
        self.failures = 0
        self.test = (
            SignalRule(confidence=args.stop_confidence, min_informative=args.stop_informative).test(
                args.stop_group_size, len(self.order)
            )
            if args.stop_group_size and self.order
            else None
        )
        self.check: SignalCheck | None = None
        self.inside: set[asyncio.Task[None]] = set()
        self.deadline = args.started + args.time_budget if args.time_budget else None
        self.cut: list[float] = []
        self.rates: list[float] = []
        self.uncut: list[bool] = []
        self.not_begun = 0
        self.limiter = asyncio.Semaphore(args.concurrency)

    def stopped(self) -> bool:
        return self.check is not None and self.check.stopped

    def look(self) -> None:
        """The futility test over the longest prefix of ended attempts in start order; when it stops,
        attempts not yet begun never begin, and those inside their episode block are cancelled (the block
        aborts the episode on the server). One still beginning its episode is left to begin it, so that
        no episode stays open unknown to us."""
        if self.test is None or self.stopped():
            return
        ended = next((i for i, s in enumerate(self.succeeded) if s is None), len(self.succeeded))
        if ended == 0:
            return
        self.check = self.test.check(sum(1 for s in self.succeeded[:ended] if s), ended)
        if self.check.stopped:
            me = asyncio.current_task()
            for job in list(self.inside):
                if job is not me:
                    job.cancel()

    async def attempt(self, client: Any, sink: Any, index: int, task: Any, member: int) -> None:
        """One attempt of ``task``: its record goes to ``sink``, then the test looks again."""
        record: dict[str, Any] = {
            "kind": "eval",
            "round": self.args.round,
            "task_id": task.task_id,
            "member": member,
            "order": index,
        }
        async with self.limiter:
            if self.stopped():
                return
            started = time.monotonic()
            limit, cut_by = self.args.episode_timeout, None
            if self.deadline is not None:
                if self.deadline - started <= 0:
                    self.not_begun += 1
                    return
                if self.deadline - started < limit:
                    limit, cut_by = self.deadline - started, self.args.time_budget
            job = asyncio.current_task()
            assert job is not None
            try:
                record |= await self._episode(client, job, task, limit)
                self._ended(index, record, time.monotonic() - started)
            except Exception as exc:
                self._failed(index, record, exc, time.monotonic() - started, limit, cut_by)
            finally:
                self.inside.discard(job)
            record["seconds"] = round(time.monotonic() - started, 3)
        record["time"] = time.time()
        sink.write(json.dumps(record) + "\n")
        sink.flush()
        self.look()

    async def _episode(self, client: Any, job: asyncio.Task[None], task: Any, limit: float) -> dict[str, Any]:
        """Run the workflow on ``task`` in one ``kind=eval`` episode within ``limit`` seconds."""
        from swarm.client.workflow import Result

        found: dict[str, Any] = {}
        async with client.episode(task.task_id, kind="eval", tenant=self.args.tenant) as ep:
            self.inside.add(job)
            if self.stopped():
                raise asyncio.CancelledError  # the block aborts the episode
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel (swarm/server/training.py)
            async with asyncio.timeout(limit):
                output = await self.run(task.data, ep.llm)
            if isinstance(output, Result):
                reward = output.reward
            elif isinstance(output, int | float):
                reward = float(output)
            else:
                raise TypeError("evaluation needs a single-server workflow (one reward)")
            if self.deadline is not None:  # how many tokens the attempt decoded
                view = await client.get_episode(ep.id)
                found["tokens"] = sum(len(call.completion_ids) for call in view.calls)
            await ep.finish(reward)
        return found | {"status": "finished", "reward": reward}

    def _ended(self, index: int, record: dict[str, Any], seconds: float) -> None:
        self.succeeded[index] = record["reward"] > 0
        self.uncut.append(record["reward"] > 0)
        if record.get("tokens") and seconds > 0:
            self.rates.append(record["tokens"] / seconds)

    def _failed(
        self,
        index: int,
        record: dict[str, Any],
        exc: Exception,
        seconds: float,
        limit: float,
        cut_by: float | None,
    ) -> None:
        self.failures += 1
        error = _failure(
            exc,
            task_id=record["task_id"],
            member=record["member"],
            seconds=seconds,
            limit_s=limit,
            cut_by=cut_by,
        )
        record |= {"status": "aborted", "reward": None, "error": error}
        if error.startswith("cut: "):
            record["cut"] = True
            self.cut.append(seconds)
        else:
            self.uncut.append(False)
        self.succeeded[index] = False  # limits are part of the evaluation

    def summary(self) -> dict[str, Any]:
        """The ``--summary`` object (see the module docstring)."""
        rate = statistics.median(self.rates) if self.rates else None
        after = statistics.median(self.cut) if self.cut else None
        test, cut, uncut = self.test, self.cut, self.uncut
        return {
            "attempts": len(self.order),
            "ended": sum(1 for s in self.succeeded if s is not None),
            "failures": self.failures,
            "signal": self.check.model_dump() if self.check is not None else None,
            "time_budget_s": self.args.time_budget or None,
            "cut": len(cut),
            "cut_after_s": after,
            "tokens_per_s": rate,
            "cut_tokens": round(rate * after) if rate is not None and after is not None else None,
            "not_begun": self.not_begun,
            "uncut_signal": (
                test.check(sum(uncut), len(uncut)).model_dump()
                if test is not None and cut and uncut
                else None
            ),
        }


async def _evaluate(args: argparse.Namespace) -> int:
    from swarm.client import AsyncSwarmClient, TaskSet, load_workflow

    run = load_workflow(args.workflow)
    tasks = list(TaskSet(args.dataset))[: args.max_tasks] if args.max_tasks else list(TaskSet(args.dataset))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    evaluation = _Evaluation(args, tasks, run)
    token = os.environ.get("SWARM_CLIENT_TOKEN") or None  # a3r passes it in the environment
    async with AsyncSwarmClient(args.server, client_id=args.client_id, client_token=token) as client:
        with out.open("a", encoding="utf-8") as sink:
            running = [
                asyncio.create_task(evaluation.attempt(client, sink, i, task, m))
                for i, (task, m) in enumerate(evaluation.order)
            ]
            await asyncio.gather(*running, return_exceptions=True)
    summary = evaluation.summary()
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary) + "\n", encoding="utf-8")
    print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see module docstring); returns the exit code."""
    started = time.monotonic()  # the --time-budget clock (the client's imports come after)
    parser = argparse.ArgumentParser(
        prog="python -m a3r.swarmops.evaluate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("workflow")
    parser.add_argument("--server", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tasks", type=int, default=None)
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--episode-timeout", type=float, default=300.0)
    parser.add_argument(
        "--time-budget",
        type=float,
        default=0.0,
        help="end the whole evaluation within this many seconds of its start; attempts it stops are cut "
        "and count as no success (0: no budget)",
    )
    parser.add_argument("--client-id", default="a3r-eval")
    parser.add_argument(
        "--tenant",
        default=None,
        help="the LoRA tenant whose adapter the attempts sample (a server with --tenants; default: its one "
        "policy)",
    )
    parser.add_argument(
        "--stop-group-size",
        type=int,
        default=0,
        help="G: stop once the attempts show too few successes for GRPO groups of G (0: never)",
    )
    parser.add_argument("--stop-confidence", type=float, default=0.95)
    parser.add_argument("--stop-informative", type=float, default=0.5)
    parser.add_argument(
        "--summary", default=None, help="write a JSON summary (and the test's last check) here"
    )
    args = parser.parse_args(argv)
    args.started = started
    if args.samples < 1 or args.concurrency < 1:
        parser.error("--samples and --concurrency must be >= 1")
    if args.stop_group_size and args.stop_group_size < 2:
        parser.error("--stop-group-size must be 0 or >= 2")
    return asyncio.run(_evaluate(args))


if __name__ == "__main__":
    sys.exit(main())
