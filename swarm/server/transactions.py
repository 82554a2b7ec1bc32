"""Multi-server finish: resolving ``prepared`` episodes whose transaction was left undecided.

A multi-model episode (`swarm.client.MultiEpisode`) finishes in two phases (docs/ARCHITECTURE.md
§Multi-server finish): every member is *prepared* (stored with its reward, not trainable), then the
*primary* member is committed (the transaction's commit point, one SQLite update on one server), then
the others. This is Percolator's primary-lock rule (Peng & Dabek, OSDI 2010, section 2.4): a secondary's fate is
the primary's. When a client or a server dies between the phases, the servers finish the job here:

* the primary, still prepared ``timeout_s`` after it was stored, aborts itself (compare-and-set, so a
  commit that arrives first wins and one that arrives later gets 409);
* a secondary, still prepared after ``timeout_s``, reads the primary from its server: ``finished`` →
  commit; ``aborted``/``infra_failure``/unknown (404) → abort; still prepared or unreachable → wait.

So all members end ``finished`` or none does, whichever process dies when.
"""

from __future__ import annotations

import time

import httpx

from swarm.errors import SwarmError
from swarm.pool import Pool, StoredEpisode
from swarm.protocol import EpisodeAbort, EpisodeStatus
from swarm.server.episodes import OpenEpisodes

_ABORTED = frozenset({EpisodeStatus.ABORTED, EpisodeStatus.INFRA_FAILURE})


async def primary_status(http: httpx.AsyncClient, txn: dict[str, str | None]) -> EpisodeStatus | None:
    """The primary member's status read from its server; ``None`` when its server does not know it (404).

    Raises:
        httpx.HTTPError: the primary's server could not be reached or answered an error other than 404.
    """
    url = f"{str(txn['primary_url']).rstrip('/')}/api/v1/episodes/{txn['primary_episode_id']}"
    response = await http.get(url)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return EpisodeStatus(response.json()["status"])


async def resolve_stale(
    episodes: OpenEpisodes, pool: Pool, http: httpx.AsyncClient, *, timeout_s: float, now: float | None = None
) -> list[StoredEpisode]:
    """Resolve the prepared episodes stored more than ``timeout_s`` seconds ago (see the module docstring).

    Args:
        episodes: the server's open episodes (they commit and abort prepared ones and tell the listeners).
        pool: the episode pool.
        http: client for reading primaries on other servers.
        timeout_s: how long a prepared episode waits for its client's commit (seconds).
        now: Unix time (default: the current time).

    Returns:
        The episodes resolved, as stored afterwards.
    """
    now = time.time() if now is None else now
    resolved = []
    for stored in pool.prepared():
        txn = stored.txn or {}
        if now - stored.finished_at < timeout_s or "txn_id" not in txn:
            continue
        txn_id = txn["txn_id"]
        if txn.get("primary_url") is None:  # the primary: no commit came in time, so the transaction aborts
            decided: EpisodeStatus | None = EpisodeStatus.INFRA_FAILURE
            why = f"transaction {txn_id} was not committed within {timeout_s:g} s"
        else:
            try:
                primary = await primary_status(http, txn)
            except (httpx.HTTPError, ValueError, KeyError):
                continue  # the primary's server is away: its fate is unknown, wait for it
            if primary is EpisodeStatus.FINISHED:
                decided, why = EpisodeStatus.FINISHED, ""
            elif primary is None or primary in _ABORTED:
                decided = EpisodeStatus.INFRA_FAILURE
                why = (
                    f"transaction {txn_id} aborted: its primary is {primary.value if primary else 'unknown'}"
                )
            else:
                continue  # primary still open or prepared: its own server decides first
        try:
            if decided is EpisodeStatus.FINISHED:
                resolved.append(episodes.commit(stored.id, txn_id))
            else:
                resolved.append(episodes.abort(stored.id, EpisodeAbort(reason=why, infra_failure=True)))
        except SwarmError:
            continue  # resolved meanwhile by the client's own commit or abort
    return resolved
