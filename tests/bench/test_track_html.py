"""The tracking dashboard: the page built from a real store's history, and that page in a real headless
Chromium (Debian's ``chromium`` package; the browser test is skipped where it is not installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import track
from PIL import Image
from track_history import Status, load_history, record_run

from memory import Store

COMMITS = ["1" * 40, "2" * 40, "3" * 40]
MACHINE = {"cpu": "Test CPU", "cores": 2}


def _history_page(tmp_path: Path) -> Path:
    """Three commits × 3 seeds of ``merge`` and ``update``; the last commit's update step is 2× slower."""
    with Store(tmp_path / "track.db") as store:
        new: dict[str, list[int]] = {}
        for index, commit in enumerate(COMMITS):
            for seed in range(3):
                config = {
                    "mode": "quick",
                    "dirty": index == 2,
                    "provenance": {
                        "versions": {"torch": "2.13.0", "transformers": "5.24"},
                        "machine": MACHINE,
                    },
                    "backend": track.BACKEND,
                }
                slow = 2.0 if index == 2 else 1.0
                ids = {
                    "merge": record_run(
                        store, benchmark="merge", description="merge", seed=seed, git_commit=commit,
                        config=config, steps=[{"tokens_ratio": 9.0 + s} for s in range(3)],
                        final={"tokens_ratio": 9.3 + seed / 1000},
                    ),
                    "update": record_run(
                        store, benchmark="update", description="update", seed=seed, git_commit=commit,
                        config=config, steps=[{"cpu_s": slow * (1 + s / 10)} for s in range(3)],
                        final={"cpu_s": slow * (1 + seed / 50)},
                    ),
                }  # fmt: skip
                if index == 2:
                    for name, run_id in ids.items():
                        new.setdefault(name, []).append(run_id)
        history = load_history(store)
        benchmarks = [track.BY_NAME["merge"], track.BY_NAME["update"]]
        verdicts = track.verdicts(history, benchmarks, new, k=3.0, min_history=3)
        assert [v.status for v in verdicts] == [Status.ok, Status.regression]
        from track_html import write_dashboard

        return write_dashboard(tmp_path / "html", history, track.SUITE, verdicts, store)


def test_the_page_has_a_plot_per_benchmark_the_versions_and_the_flagged_regression(tmp_path: Path) -> None:
    page = _history_page(tmp_path).read_text()
    assert page.count("<svg") == 2
    # the candidate (judged) commit is named at the top and in each verdict row
    top = page[: page.index("<h2>")]
    assert "Candidate commit: <code title='" + COMMITS[2] + "'>3333333333</code> (dirty)" in top
    verdicts = page[page.index("id='verdicts'") : page.index("</table>", page.index("id='verdicts'"))]
    assert verdicts.count("<td>3333333333</td>") == 2 and "1111111111" not in verdicts
    # every commit's curve is drawn (its own group), and the legend lists each commit's value
    for commit in COMMITS:
        assert f'id="curve-merge-{commit[:10]}"' in page and f"{commit[:10]} · tokens_ratio 9.301" in page
    assert "id='bench-merge'" in page and "id='bench-update'" in page and "bench-learning" not in page
    versions = page[page.index("id='versions'") : page.index("</table>", page.index("id='versions'"))]
    assert versions.count("<tr>") == 1 + len(COMMITS) and "2.13.0" in versions and "hf/torch/cpu" in versions
    assert "Regressions: update (cpu_s +" in page
    assert "<script" not in page and " src=" not in page and 'href="http' not in page  # nothing to fetch


@pytest.mark.skipif(
    shutil.which("chromium") is None and os.environ.get("A3R_REQUIRE_CHROMIUM") != "1",
    reason="chromium is not installed (apt-get install chromium; CI installs it: .ci/chromium.sh)",
)
def test_the_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    page = _history_page(tmp_path)
    shot = tmp_path / "shot.png"
    base = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--enable-logging=stderr",
        "--v=0",
    ]
    done = subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1200,1600", "--hide-scrollbars", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert console == []
    dom = subprocess.run(
        [*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=False
    ).stdout
    assert dom.count("<svg") == 2 and "Regressions: update" in dom and "Candidate commit: " in dom
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 1600)
    rgb = np.asarray(image).astype(int)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    red_row = int(((r > 245) & (g > 215) & (g < 230) & (b > 215) & (b < 230)).sum())  # #fdd background
    assert red_row > 1000, "the regression row is not highlighted"
    # Each commit's colour (matplotlib's C0, C1, C2) shows all its points, not just its legend entry: the
    # first two commits' equal points (merge, update) are not hidden under the last one's. Episodes and
    # timed repeats are independent draws, drawn as points, not joined: ~355, ~450 and ~310 pixels; drawn
    # on top of one another (no sideways offset) the first commit's blue came to ~190 pixels.
    colours = {"C0": (0x1F, 0x77, 0xB4), "C1": (0xFF, 0x7F, 0x0E), "C2": (0x2C, 0xA0, 0x2C)}
    for name, colour in colours.items():
        near = (abs(r - colour[0]) < 40) & (abs(g - colour[1]) < 40) & (abs(b - colour[2]) < 40)
        assert int(near.sum()) > 250, f"commit {name}'s points are not visible"


def test_the_page_names_the_checked_out_commit_one_verdict_per_mode_and_why_none_compares(
    tmp_path: Path,
) -> None:
    """Found by a fresh user: the page named the history's latest commit as the candidate while another
    was checked out; the verdict table had no mode column (a commit with full and quick runs was judged
    on its quick ones only); "no comparable history" stood beside a chart showing an earlier run, its
    reason (1 earlier run, a band needs 3) nowhere on the page."""
    from track_html import write_dashboard

    latest, head = COMMITS[1], "e" * 40
    with Store(tmp_path / "track.db") as store:
        for commit, mode in ((COMMITS[0], "quick"), (latest, "quick"), (latest, "full")):
            config = {"mode": mode, "provenance": {"machine": MACHINE}, "backend": track.BACKEND}
            record_run(
                store, benchmark="merge", description="merge", seed=0, git_commit=commit, config=config,
                steps=[{"tokens_ratio": 9.0}], final={"tokens_ratio": 9.2},
            )  # fmt: skip
        history = load_history(store)
        rows = track.verdicts(history, [track.BY_NAME["merge"]], {}, k=3.0, min_history=3, checked_out=head)
        assert [(v.commit, v.mode, v.status) for v in rows] == [
            (latest, "full", Status.no_history),
            (latest, "quick", Status.no_history),
        ]
        page = write_dashboard(tmp_path / "html", history, track.SUITE, rows, store, checked_out=head)
    text = page.read_text()
    top = text[: text.index("<h2>")]
    assert f"<code title='{head}'>eeeeeeeeee</code> (checked out), which has no runs in this history" in top
    assert f"merge: judged their latest commit <code title='{latest}'>2222222222</code> instead" in top
    verdicts = text[text.index("id='verdicts'") : text.index("</table>", text.index("id='verdicts'"))]
    assert "<th>mode</th>" in verdicts and "<td>full</td>" in verdicts and "<td>quick</td>" in verdicts
    reason = "1 earlier run of the same mode, sizes and machine; a band needs 3"
    section = text[text.index("id='bench-merge'") :]
    assert reason in text[text.index("id='verdict-notes'") :] and "verdict [quick] for 2222222222" in section
    assert reason in section[: section.index("<div class='plot'>")]  # beside the chart, above it
