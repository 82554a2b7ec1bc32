"""The soak of ``bench/soak.py`` in short (20 clients, a real ``swarm serve`` process): random
begin / call / finish / abort / disconnects; the server stays up, every begun episode is in the pool
exactly once with the status its client gave it, and no child process outlives the stopped server. With
``--train`` (LoRA on the CPU, small groups so steps happen in seconds): every consumed episode is trained
exactly once, as its step says. The script's exit code is its verdict; its ``--json`` has the numbers.
The checks' failing side is tested on made-up pools (no server)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _soak(tmp_path: Path, *flags: str) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--clients", "20", *flags, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    return run.stdout, json.loads(out.read_text())


def test_a_short_soak_loses_nothing_and_doubles_nothing(tmp_path: Path) -> None:
    out, report = _soak(tmp_path, "--seconds", "6", "--episode-timeout", "2")
    assert out.splitlines()[0].startswith("soak PASS · nothing lost: yes"), out  # the verdict comes first
    assert "FAIL" not in out and out.count("PASS") == len(report["checks"]) + 1, out
    assert report["passed"] and all(report["checks"].values()), report["checks"]
    assert "no child process alive right after the stop" in report["checks"]
    begun = next(line for line in out.splitlines() if "episodes begun" in line)
    assert int(begun.split("│")[2].strip()) >= 20, out  # the clients did work
    pool = report["pool"]
    assert pool["begun"] == pool["pool_rows"] >= 20 and pool["missing"] == pool["extra"] == 0, pool


def test_a_short_training_soak_trains_every_consumed_episode_once(tmp_path: Path) -> None:
    out, report = _soak(
        tmp_path,
        *("--seconds", "10", "--episode-timeout", "2", "--train", "--lora-rank", "4"),
        *("--tasks", "2", "--batch-size", "1", "--group-size", "4"),
    )
    assert "FAIL" not in out and "trained once: yes" in out.splitlines()[0], out
    assert report["checks"]["every consumed episode trained exactly once, as its step says"], report
    training = report["training"]
    assert training["steps"] >= 1 and training["trained"] >= 4 and training["problems"] == [], training
    assert report["server_status"]["step"] == training["steps"]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak_bench", ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_training_check_names_what_is_not_trained_exactly_once() -> None:
    check = _bench()._training_check
    # pool rows: (id, status, reward, trained_step, task_id); G = 2
    rows = [
        ("a", "finished", 1.0, 1, "t"),
        ("b", "aborted", None, 1, "t"),
        ("c", "infra_failure", None, 1, "u"),
        ("d", "finished", 0.5, None, "u"),
    ]
    step1 = {"step": 1, "groups": 1, "episodes_dropped": 1, "rewound_steps": []}
    status = {"step": 1, "episodes": {"pending": 1}}
    numbers, problems = check(rows, [step1], status, 2)
    assert problems == [] and (numbers["trained"], numbers["dropped"], numbers["pending"]) == (2, 1, 1)

    _, problems = check([*rows[:3], ("d", "finished", 0.5, 2, "u")], [step1], status, 2)
    assert any("steps [2] that metrics.jsonl does not have" in p for p in problems), problems
    _, problems = check(rows, [step1, {**step1, "step": 1, "rewound_steps": [1]}], status, 2)
    assert any("not 1…2" in p for p in problems) and "steps were rewound" in problems, problems
    _, problems = check(rows, [{**step1, "groups": 2}], status, 2)
    assert any("the step says 2 groups of 2" in p for p in problems), problems
    _, problems = check(rows, [step1], {"step": 1, "episodes": {"pending": 0}}, 2)
    assert any("the server counts 0" in p for p in problems), problems


def test_the_pool_check_counts_lost_doubled_and_wrong_episodes() -> None:
    bench = _bench()
    tally = bench.Tally(
        began={"a": "finish", "b": "vanish", "c": "abort", "d": "unknown"}, rewards={"a": 0.5}
    )
    rows = [
        ("a", "finished", 0.25, None, "t"),  # another reward
        ("b", "infra_failure", None, None, "t"),
        ("b", "infra_failure", None, None, "t"),  # twice
        ("d", "finished", 1.0, None, "t"),  # unverified: in the pool once is all that is checked
        ("e", "finished", 1.0, None, "t"),  # nobody began it
    ]  # c is missing
    assert bench._pool_check(rows, tally) == {
        "begun": 4,
        "pool_rows": 5,
        "missing": 1,
        "extra": 1,
        "twice": 1,
        "wrong_status": 1,
        "unverified": 1,
    }
