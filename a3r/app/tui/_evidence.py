"""What a patch's rationale cites as evidence: runs (``run 12``, ``runs 3, 4 and 5``) and episodes
(``ep-<hex>``, the swarm server's episode ids).

This is the contract for the analyst writing rationales: cite runs by ``run N`` (``#`` optional) and
episodes by their id; the review screen then shows those runs' latest metrics (only the metrics the
rationale names, when it names any) and lets the reviewer open the cited episodes token by token.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from memory import PatchPublic, RunWithMetrics, Store

__all__ = ["PatchEvidence", "cited_episodes", "cited_metrics", "cited_runs", "gather_evidence"]

_RUN_LIST = re.compile(r"\bruns?\s+#?\d+(?:\s*(?:,|and|&|or)\s*#?\d+)*", re.IGNORECASE)
_NUMBER = re.compile(r"\d+")
_EPISODE = re.compile(r"\bep-[0-9a-f]{6,}\b")


def _unique(items: Iterable[str | int]) -> list[str | int]:
    return list(dict.fromkeys(items))


def cited_runs(text: str) -> list[int]:
    """Run ids cited in ``text``, in order of first mention, without repeats.

    Example:
        >>> cited_runs("Runs 3, 4 and #7 collapse; run 3 worst.")
        [3, 4, 7]
    """
    ids = (int(n) for match in _RUN_LIST.finditer(text) for n in _NUMBER.findall(match.group()))
    return [int(i) for i in _unique(ids)]


def cited_episodes(text: str) -> list[str]:
    """Episode ids (``ep-`` and at least 6 hex digits) cited in ``text``, in order, without repeats.

    Example:
        >>> cited_episodes("see ep-0a1b2c3d and ep-0a1b2c3d")
        ['ep-0a1b2c3d']
    """
    return [str(e) for e in _unique(_EPISODE.findall(text))]


def cited_metrics(text: str, names: Iterable[str]) -> list[str]:
    """Those of ``names`` (metric names such as ``reward/mean``) that occur in ``text`` as whole words."""
    return [name for name in names if re.search(rf"(?<![\w/]){re.escape(name)}(?![\w/])", text) is not None]


@dataclass(frozen=True, slots=True)
class PatchEvidence:
    """The evidence a patch's rationale cites, resolved against the store.

    Attributes:
        runs: Cited runs that exist, with their latest metrics, in order of citation.
        missing_runs: Cited run ids that are not runs of the patch's study.
        metrics: Metric names the rationale mentions (empty: it names none, show all).
        episodes: Cited episode ids, in order of citation.
        server_url: Server to fetch the cited episodes from: the first cited run's, else the newest run
            of the study that recorded one; ``None`` when no run recorded a server.
    """

    runs: tuple[RunWithMetrics, ...] = ()
    missing_runs: tuple[int, ...] = ()
    metrics: tuple[str, ...] = ()
    episodes: tuple[str, ...] = ()
    server_url: str | None = None


def gather_evidence(store: Store, patch: PatchPublic) -> PatchEvidence:
    """Resolve what ``patch.rationale`` cites (see the module docstring) against the store.

    Raises:
        memory.StoreError: The store cannot be read.
    """
    study_runs = {run.id: run for run in store.runs(patch.study_id)}
    wanted = cited_runs(patch.rationale)
    runs = []
    missing = []
    for run_id in wanted:
        run = study_runs.get(run_id)
        if run is None:
            missing.append(run_id)
        else:
            runs.append(run)
    names = sorted({name for run in runs for name in run.latest_metrics})
    servers = [run.server_url for run in runs if run.server_url]
    servers += [run.server_url for run in reversed(study_runs.values()) if run.server_url]
    return PatchEvidence(
        runs=tuple(runs),
        missing_runs=tuple(missing),
        metrics=tuple(cited_metrics(patch.rationale, names)),
        episodes=tuple(cited_episodes(patch.rationale)),
        server_url=servers[0] if servers else None,
    )
