"""The tracking dashboard: one static HTML page (no JavaScript, no network) that names the candidate
commit (the one judged) at the top and has, per benchmark and suite mode (quick and full runs are
never drawn together, as they are never judged together), its per-step curve for each commit (each
commit its own colour and marker, offset sideways so equal curves stay visible, the legend listing its
primary metric; points of independent episodes, games or repeats are not joined) and its primary metric
per commit (inline SVG drawn by matplotlib), the table of
versions (commit, dirty flag, mode, machine, package versions, backend) and the verdicts (with the
judged commit) with the regressions flagged.
"""

from __future__ import annotations

import html
import io
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from track_history import VERDICT_COLUMNS, History, Status, TrackRun, Verdict, verdict_cells

__all__ = ["render_dashboard", "write_dashboard"]

MAX_COMMITS = 8
"""Commits drawn per plot (the latest ones)."""

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
"""One marker per commit of a plot (with its colour), so curves that coincide stay distinguishable."""

DODGE = 0.06
"""Sideways offset between consecutive commits' curves, in steps: equal values (a deterministic metric
such as ``tokens_ratio``) would otherwise draw every commit's curve on top of one another."""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f2f2f2; }
.regression { background: #fdd; font-weight: bold; }
.improvement { background: #dfd; }
tr[class^='not-comparable'] { background: #eee; font-style: italic; }
.bench { margin: 2em 0; }
.plot svg { max-width: 100%; height: auto; }
code { font-size: 0.95em; }
.candidate { font-size: 1.2em; }
"""


def _short(commit: str) -> str:
    return commit[:10]


INDEPENDENT_STEPS = frozenset({"episode", "game", "timed repeat"})
"""Curve x axes whose points are independent draws (episodes, games, repeats), not a time series: drawn
as points, never joined by a line."""


def _plot_mode(
    axes: Any,
    bench: Any,
    runs: list[TrackRun],
    history: History,
    metric_history: dict[int, list[float]],
    mode: str,
    *,
    first: bool = True,
) -> None:
    """One row of the figure: ``mode``'s runs only (verdicts compare within a mode, so do the charts)."""
    from matplotlib.ticker import MaxNLocator

    left, right = axes
    order = [c for c in history.commits() if any(r.commit == c for r in runs)][-MAX_COMMITS:]
    values = {
        commit: [v for r in runs if r.commit == commit and (v := r.value(bench.metric)) is not None]
        for commit in order
    }
    step = getattr(bench, "step", "step")
    joined = step not in INDEPENDENT_STEPS
    for index, commit in enumerate(order):
        curves = [
            metric_history[r.run.id] for r in runs if r.commit == commit and metric_history.get(r.run.id)
        ]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        mean = [statistics.fmean(c[i] for c in curves) for i in range(length)]
        shift = (index - (len(order) - 1) / 2) * DODGE
        label = _short(commit) + (
            f" · {bench.metric} {statistics.median(values[commit]):.4g}" if values[commit] else ""
        )
        (line,) = left.plot(
            [step_ + shift for step_ in range(1, length + 1)], mean, marker=MARKERS[index % len(MARKERS)],
            ms=4, lw=1.2 if joined else 0, color=f"C{index % 10}", label=label,
        )  # fmt: skip
        line.set_gid(f"curve-{bench.name}-{_short(commit)}" + ("" if first else f"-{mode}"))
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel(step + (" (commits offset sideways)" if len(order) > 1 else ""))
    left.set_ylabel(bench.curve)
    each = "" if joined else ", independent draws: not joined"
    # two lines each: the browser's font (SVG text is not embedded) is wider than matplotlib's, and one
    # line ran past the panel into the next one's title
    left.set_title(f"{bench.name} [{mode}]: {bench.curve} per {step}\n(mean over seeds{each})")
    if order:
        left.legend(fontsize=7, loc="best", title=f"commit · {bench.metric} (median)", title_fontsize=7)
    for index, commit in enumerate(order):
        right.scatter(
            [index] * len(values[commit]), values[commit], color=f"C{index % 10}", s=18,
            marker=MARKERS[index % len(MARKERS)],
        )  # fmt: skip
        if values[commit]:
            right.plot(
                [index - 0.3, index + 0.3], [statistics.median(values[commit])] * 2, color="black", lw=1
            )
    right.set_xticks(range(len(order)), [_short(c) for c in order], rotation=30, fontsize=7)
    better = "higher" if bench.higher_is_better else "lower"
    right.set_title(f"{bench.metric} per commit [{mode}]\n({better} is better; bar = median)")


def _plot(bench: Any, runs: list[TrackRun], history: History, metric_history: dict[int, list[float]]) -> str:
    """SVG with one row per suite mode (quick, full: never mixed, as in the verdicts), each of two
    panels: the per-step curve (mean over seeds) per commit, and the metric per commit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r.mode for r in runs})
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "track", "font.size": 9}):
        fig, axes = plt.subplots(len(modes), 2, figsize=(10, 3.2 * len(modes)), squeeze=False)
        for index, (row, mode) in enumerate(zip(axes, modes, strict=True)):
            of_mode = [r for r in runs if r.mode == mode]
            _plot_mode(row, bench, of_mode, history, metric_history, mode, first=index == 0)
        fig.tight_layout()
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata=dict.fromkeys(("Creator", "Date", "Format", "Type")))
        plt.close(fig)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]


def _versions_table(history: History) -> str:
    rows = []
    for commit in history.commits():
        runs = [r for rs in history.runs.values() for r in rs if r.commit == commit]
        first = min(runs, key=lambda r: r.run.started_at)
        config = first.run.config
        prov = config.get("provenance", {})
        versions = prov.get("versions", {})
        backend = config.get("backend", {})
        modes = sorted({r.mode for r in runs})
        seeds = sorted({r.run.seed for r in runs if r.run.seed is not None})
        loads = [float(r.run.config["load_avg_1m"]) for r in runs if "load_avg_1m" in r.run.config]
        cells = [
            f"<code>{html.escape(_short(commit))}</code>",
            html.escape(first.run.started_at.strftime("%Y-%m-%d %H:%M")),
            "yes" if any(r.run.config.get("dirty") for r in runs) else "no",
            html.escape(", ".join(modes)),
            html.escape(", ".join(map(str, seeds))),
            str(len(runs)),
            html.escape(str(versions.get("torch", "?"))),
            html.escape(str(versions.get("transformers", "?"))),
            html.escape(str(versions.get("a3r", "?"))),
            html.escape("/".join(str(backend.get(k, "?")) for k in ("engine", "trainer", "device"))),
            html.escape(first.machine),
            f"{statistics.fmean(loads):.1f}" if loads else "?",
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = (
        "commit", "first run (UTC)", "dirty", "mode", "seeds", "runs", "torch", "transformers", "a3r",
        "engine/trainer/device", "machine", "load avg (1 min)",
    )  # fmt: skip
    return _table("versions", head, rows)


def _commit_code(commit: str) -> str:
    return f"<code title='{html.escape(commit)}'>{html.escape(_short(commit))}</code>"


def _candidate(history: History, candidates: dict[str, list[str]], checked_out: str | None = None) -> str:
    """The commit(s) being judged, with their dirty flag (several in a report of benchmarks whose
    latest runs are of different commits). With ``checked_out`` (``--report-only``: the candidate is
    the checked-out commit), it is named first, and a benchmark it has no runs of says which commit was
    judged instead."""
    if not candidates:
        return "<p id='candidate'>No candidate commit: no benchmark was judged.</p>"
    parts = []
    for commit, benchmarks in candidates.items():
        if checked_out and commit != checked_out:
            continue
        runs = [r for rs in history.runs.values() for r in rs if r.commit == commit]
        dirty = " (dirty)" if any(r.run.config.get("dirty") for r in runs) else ""
        which = "" if len(candidates) == 1 else f" ({html.escape(', '.join(benchmarks))})"
        parts.append(f"{_commit_code(commit)}{dirty}{which}")
    if not checked_out:
        return f"<p id='candidate' class='candidate'>Candidate commit: {', '.join(parts)}</p>"
    head = f"Candidate commit: {_commit_code(checked_out)} (checked out)"
    others = [
        f"{html.escape(', '.join(benchmarks))}: judged their latest commit {_commit_code(commit)} instead"
        for commit, benchmarks in candidates.items()
        if commit != checked_out
    ]
    if others and not parts:
        head += ", which has no runs in this history"
    elif others:
        head += f" ({html.escape(', '.join(candidates.get(checked_out, [])))})"
    notes = "".join(f"<br>{other}" for other in others)
    return f"<p id='candidate' class='candidate'>{head}{notes}</p>"


def _table(name: str, head: Sequence[str], rows: Sequence[str]) -> str:
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f"<table id='{name}'><tr>{header}</tr>{''.join(rows)}</table>"


def _verdicts_table(verdicts: Sequence[Verdict]) -> str:
    rows = [
        f"<tr class='{v.status.value.replace(' ', '-')}'>"
        + "".join(f"<td>{html.escape(c)}</td>" for c in verdict_cells(v))
        + "</tr>"
        for v in verdicts
    ]
    notes = "".join(
        f"<li>{html.escape(f'{v.benchmark} [{v.mode}]: {v.status.value}: {v.note}')}</li>"
        for v in verdicts
        if v.note
    )
    return _table("verdicts", VERDICT_COLUMNS, rows) + (
        f"<ul id='verdict-notes'>{notes}</ul>" if notes else ""
    )


def _bench_verdicts(name: str, verdicts: Sequence[Verdict]) -> str:
    """One line per verdict of benchmark ``name`` (beside its chart: a chart may show runs the verdict
    did not compare, and the line says why)."""
    lines = [
        f"verdict [{v.mode}] for {_short(v.commit)}: {v.status.value}" + (f": {v.note}" if v.note else "")
        for v in verdicts
        if v.benchmark == name
    ]
    return "".join(f"<p class='bench-verdict'>{html.escape(line)}</p>" for line in lines)


def render_dashboard(
    history: History,
    suite: Sequence[Any],
    verdicts: Sequence[Verdict],
    metric_history: dict[int, list[float]],
    checked_out: str | None = None,
) -> str:
    """The page as a string.

    Args:
        history: Finished tracked runs.
        suite: The benchmarks (``name``, ``description``, ``metric``, ``curve``, ``higher_is_better``;
            optionally ``step``, what one step of the curve is).
        verdicts: The regression rule's results to show.
        metric_history: Per run id, the per-step values of its benchmark's curve metric.
        checked_out: The commit checked out (``--report-only``): the candidate the page names.
    """
    flagged = [v for v in verdicts if v.status is Status.regression]
    summary = (
        "<p class='regression' id='flagged'>Regressions: "
        + html.escape(", ".join(f"{v.benchmark} ({v.metric} {v.relative_change:+.1%})" for v in flagged))
        + "</p>"
        if flagged
        else "<p id='flagged'>No regression flagged.</p>"
    )
    candidates: dict[str, list[str]] = {}
    for v in verdicts:  # a benchmark judged in two modes is named once
        if v.benchmark not in candidates.setdefault(v.commit, []):
            candidates[v.commit].append(v.benchmark)
    sections = []
    for bench in suite:
        runs = history.runs.get(bench.name, [])
        if not runs:
            continue
        sections.append(
            f"<div class='bench' id='bench-{html.escape(bench.name)}'><h2>{html.escape(bench.name)}</h2>"
            f"<p>{html.escape(bench.description)}</p>{_bench_verdicts(bench.name, verdicts)}"
            f"<div class='plot'>{_plot(bench, runs, history, metric_history)}</div></div>"
        )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>A3R benchmark tracking</title>"
        f"<style>{STYLE}</style></head><body><h1>A3R benchmark tracking</h1>"
        f"{_candidate(history, candidates, checked_out)}<p>Generated by <code>bench/track.py --html</code> from the knowledge store. Verdict band: the "
        "earlier commits' mean ± k·σ of the same mode and machine, with a minimum relative change.</p>"
        f"{summary}<h2>Verdicts</h2>{_verdicts_table(verdicts)}"
        f"<h2>Versions</h2>{_versions_table(history)}{''.join(sections)}</body></html>"
    )


def write_dashboard(
    folder: Path,
    history: History,
    suite: Sequence[Any],
    verdicts: Sequence[Verdict],
    store: Any,
    *,
    checked_out: str | None = None,
) -> Path:
    """Render the page into ``folder/index.html`` (folder created); returns the page's path.

    ``store`` (a `memory.Store`) supplies each run's per-step curve; ``checked_out`` is the commit the
    page names as the candidate (`render_dashboard`)."""
    curves = {
        r.run.id: [p.value for p in store.metric_history(r.run.id, bench.curve)]
        for bench in suite
        for r in history.runs.get(bench.name, [])
    }
    folder.mkdir(parents=True, exist_ok=True)
    page = folder / "index.html"
    page.write_text(render_dashboard(history, suite, verdicts, curves, checked_out), encoding="utf-8")
    return page
