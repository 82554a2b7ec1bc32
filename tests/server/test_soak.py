"""The soak of ``bench/soak.py`` in short (20 clients, 6 s, a real ``swarm serve`` process): random
begin / call / finish / abort / disconnects; the server stays up and every begun episode is in the pool
exactly once with the status its client gave it. The script's exit code is its verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_soak_loses_nothing_and_doubles_nothing() -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "soak.py"),
            "--clients",
            "20",
            "--seconds",
            "6",
            "--episode-timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr[-3000:]
    assert "FAIL" not in out and out.count("PASS") == 3, out
    begun = next(line for line in out.splitlines() if "episodes begun" in line)
    assert int(begun.split("│")[2].strip()) >= 20, out  # the clients did work
