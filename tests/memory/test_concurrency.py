"""Concurrent writers in separate OS processes lose no update, on SQLite and on PostgreSQL.

Two processes (spawned, so each has its own interpreter, engine and connections) start together
behind a barrier and interleave: appends (metric points, events), read-modify-writes (artifact
version numbers, the union of a finding's seeds), decisions on their own patches, and a race on the
same pending patches, where exactly one decision per patch may win.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from typing import Any

import pytest

from memory import InvalidTransition, PatchStatus, Store

WRITES = 40  # per process and per kind of write
WORKERS = 2


def _writer(url: str, role: int, ids: dict[str, Any], barrier: Barrier) -> tuple[list[int], list[int]]:
    store = Store(url, busy_timeout_s=60)
    barrier.wait(timeout=120)
    won: list[int] = []
    lost: list[int] = []
    for i in range(WRITES):
        store.log_metrics(ids["run"], step=i, metrics={f"worker{role}/i": float(i), "shared": float(role)})
        store.log_event(f"worker {role} write {i}", run_id=ids["run"])
        store.add_artifact(ids["study"], "report", "notes.md", f"worker {role} note {i}\n")
        store.add_finding_seeds(ids["finding"], [role * 1000 + i])
        if i < len(ids["own_patches"][role]):
            store.decide_patch(ids["own_patches"][role][i], approve=True, by=f"worker{role}")
        if i < len(ids["shared_patches"]):
            patch_id = ids["shared_patches"][i]
            try:
                store.decide_patch(patch_id, approve=role == 0, by=f"worker{role}", note=f"from {role}")
                won.append(patch_id)
            except InvalidTransition:
                lost.append(patch_id)
    store.close()
    return won, lost


def _opener(url: str, role: int, barrier: Barrier) -> tuple[str | None, int]:
    barrier.wait(timeout=120)
    with Store(url) as store:
        study = store.create_study(f"opened concurrently by {role}")
        return store.schema_revision, study.id


def _child(target: Any, args: tuple[Any, ...], role: int, barrier: Barrier, results: Any) -> None:
    try:
        results.put((role, target(args[0], role, *args[1:], barrier), None))
    except BaseException as exc:  # reported to the parent, which fails the test at once
        results.put((role, None, f"{type(exc).__name__}: {exc}"))
        raise


def _run_processes(target: Any, args: tuple[Any, ...]) -> list[Any]:
    """Run ``target(url, role, *rest, barrier)`` in WORKERS spawned processes; results by role."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WORKERS)
    results = context.Queue()
    processes = [
        context.Process(target=_child, args=(target, args, role, barrier, results)) for role in range(WORKERS)
    ]
    for process in processes:
        process.start()
    try:
        collected = sorted(results.get(timeout=300) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    errors = [error for _, _, error in collected if error]
    assert not errors, errors
    assert [process.exitcode for process in processes] == [0] * WORKERS
    return [value for _, value, _ in collected]


def test_two_processes_lose_no_update(store: Store, store_url: str) -> None:
    study = store.create_study("concurrency")
    experiment = store.create_experiment(study.id, "e")
    run = store.start_run(experiment.id)
    finding = store.add_finding(study.id, statement="replicates", confidence=0.5)
    base = store.add_artifact(study.id, "reward", "reward.py", "def reward(): return 0\n")

    def new_patch() -> int:
        return store.propose_patch(base.id, diff="d", rationale="r").id

    ids: dict[str, Any] = {
        "study": study.id,
        "run": run.id,
        "finding": finding.id,
        "own_patches": [[new_patch() for _ in range(10)] for _ in range(WORKERS)],
        "shared_patches": [new_patch() for _ in range(20)],
    }
    outcomes = _run_processes(_writer, (store_url, ids))

    # Appends: every metric point and event of both processes.
    points = store.metric_history(run.id)
    assert len(points) == WORKERS * WRITES * 2
    for role in range(WORKERS):
        assert sorted(p.step for p in points if p.name == f"worker{role}/i") == list(range(WRITES))
    assert len(store.events(run_id=run.id)) == WORKERS * WRITES

    # Read-modify-write: version numbers are dense and unique, no note lost.
    notes = [a for a in store.artifacts(study.id) if a.name == "notes.md"]
    assert [a.version for a in notes] == list(range(1, WORKERS * WRITES + 1))
    assert {a.content for a in notes} == {
        f"worker {r} note {i}\n" for r in range(WORKERS) for i in range(WRITES)
    }
    assert store.findings(study.id)[0].seeds == sorted(
        r * 1000 + i for r in range(WORKERS) for i in range(WRITES)
    )

    # Each process's own patches carry its decision.
    for role, own in enumerate(ids["own_patches"]):
        assert {(store.get_patch(p).status, store.get_patch(p).decided_by) for p in own} == {
            (PatchStatus.approved, f"worker{role}")
        }

    # Racing on the same pending patches: exactly one decision each, and it is the stored one.
    won = {role: set(w) for role, (w, _) in enumerate(outcomes)}
    lost = {role: set(lo) for role, (_, lo) in enumerate(outcomes)}
    shared = set(ids["shared_patches"])
    assert won[0] | won[1] == shared and not (won[0] & won[1])
    assert lost[0] == won[1] and lost[1] == won[0]
    for patch_id in shared:
        patch = store.get_patch(patch_id)
        winner = 0 if patch_id in won[0] else 1
        assert patch.decided_by == f"worker{winner}"
        assert patch.status is (PatchStatus.approved if winner == 0 else PatchStatus.rejected)
        assert patch.note == f"from {winner}"


def test_two_processes_open_a_fresh_store_at_once(store_url: str) -> None:
    outcomes = _run_processes(_opener, (store_url,))
    assert sorted(outcomes) == [("0002", 1), ("0002", 2)]


@pytest.mark.parametrize("approve", [True, False])
def test_second_decision_in_same_process_is_refused(store: Store, approve: bool) -> None:
    study = store.create_study("q")
    artifact = store.add_artifact(study.id, "reward", "r.py", "x")
    patch = store.propose_patch(artifact.id, diff="d", rationale="r")
    store.decide_patch(patch.id, approve=approve, by="a")
    with pytest.raises(InvalidTransition):
        store.decide_patch(patch.id, approve=not approve, by="b")
    assert store.get_patch(patch.id).decided_by == "a"
