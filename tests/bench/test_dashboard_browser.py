"""The dashboard as ``bench/track.py --report-only --history FILE --html DIR`` writes it, read by a real
headless Chromium: a comparison at a very different machine load is shown "not comparable", never as a
(green) improvement, and the user's own ``.a3r/memory.db`` is left byte for byte as it was.

Skipped without Debian's ``chromium`` unless ``A3R_REQUIRE_CHROMIUM=1`` (CI sets it: ``.ci/chromium.sh``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import track
from track_history import LOAD_RATIO, export_history, record_run, track_study

from memory import Store

ROOT = Path(__file__).resolve().parents[2]
TRACK = ROOT / "bench" / "track.py"
EARLIER = ["a" * 40, "b" * 40, "c" * 40]
CANDIDATE = "d" * 40
CORES = 2
IDLE = 0.2 * CORES  # 1-minute load average of the earlier commits' runs
BUSY = IDLE * LOAD_RATIO * 4  # the candidate's: far beyond LOAD_RATIO times the earlier ones'
GREEN = "rgb(221, 255, 221)"  # .improvement's #dfd
GREY = "rgb(238, 238, 238)"  # the not-comparable rows' #eee

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None and os.environ.get("A3R_REQUIRE_CHROMIUM") != "1",
    reason="chromium is not installed (apt-get install chromium; CI installs it: .ci/chromium.sh)",
)


def _history_file(tmp_path: Path) -> Path:
    """A tracking history exported by `track_history.export_history`: three earlier commits × 3 seeds of
    ``update`` (CPU s, lower is better) and ``throughput`` (tokens/s, higher is better), both timings;
    the candidate commit halves ``update``'s CPU seconds at a machine load 8× the earlier runs' (not
    comparable), and doubles ``throughput`` at the same load as before (a real improvement)."""
    with Store(tmp_path / "build.db") as store:
        for commit in [*EARLIER, CANDIDATE]:
            candidate = commit == CANDIDATE
            for seed in range(3):
                for name, value, load in (
                    ("update", 0.5 if candidate else 1.0, BUSY if candidate else IDLE),
                    ("throughput", 200.0 if candidate else 100.0, IDLE),
                ):
                    metric = track.BY_NAME[name].metric
                    config = {
                        "mode": "quick",
                        "load_avg_1m": load,
                        "provenance": {"machine": {"cpu": "Test CPU", "cores": CORES}},
                        "backend": track.BACKEND,
                    }
                    jitter = 1 + seed / 100
                    record_run(
                        store, benchmark=name, description=name, seed=seed, git_commit=commit, config=config,
                        steps=[{metric: value * jitter}], final={metric: value * jitter},
                    )  # fmt: skip
        return export_history(store, track_study(store), tmp_path / "history.json")


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done


def _digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path → SHA-256 of its bytes)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_load_mismatched_comparison_is_not_comparable_and_report_only_leaves_the_store(
    tmp_path: Path,
) -> None:
    history = _history_file(tmp_path)
    work = tmp_path / "work"  # the user's working folder, with its own a3r store
    with Store(work / ".a3r" / "memory.db") as own:
        own.create_study("the user's own study", kind="track")  # even a tracking study: not touched
    before = _digest(work / ".a3r")
    html = tmp_path / "html"
    done = subprocess.run(
        [sys.executable, str(TRACK), "--report-only", "--history", str(history), "--html", str(html)],
        capture_output=True, text=True, timeout=600, cwd=work, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert _digest(work / ".a3r") == before  # byte-identical, and no journal or new file beside it

    # The page, as the browser lays it out: a probe script (added to a copy; the page itself has none)
    # writes each verdict row's computed background into the DOM that --dump-dom prints.
    page = (html / "index.html").read_text(encoding="utf-8")
    assert "<script" not in page
    probe = html / "probe.html"
    probe.write_text(
        page.replace(
            "</body>",
            "<script>for (const tr of document.querySelectorAll('#verdicts tr'))"
            " tr.dataset.bg = getComputedStyle(tr).backgroundColor;</script></body>",
        ),
        encoding="utf-8",
    )
    dom = _chromium("--dump-dom", probe.as_uri()).stdout
    cells = {}  # benchmark -> (the row's class, its computed background, its cells' text)
    for cls, bg, row in re.findall(r"<tr class=\"([^\"]*)\" data-bg=\"([^\"]*)\">(.*?)</tr>", dom):
        texts = re.findall(r"<td>(.*?)</td>", row)
        cells[texts[0]] = (cls, bg, texts)
    assert set(cells) == {"update", "throughput"}, dom
    cls, bg, update = cells["update"]
    assert update[1] == CANDIDATE[:10] and update[-1] == "not comparable (load)"
    assert "improvement" not in cls and bg != GREEN and bg == GREY
    cls, bg, throughput = cells["throughput"]  # the same load: the improvement is shown, and green
    assert throughput[-1] == "improvement" and cls == "improvement" and bg == GREEN
    assert "No regression flagged." in dom
