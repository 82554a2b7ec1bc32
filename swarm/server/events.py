"""The server's event log: an in-memory ring for late readers, a JSONL file, and live SSE subscribers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from swarm.protocol import Event, EventLevel


def last_seq(path: Path, tail_bytes: int = 65536) -> int:
    """The ``seq`` of the last whole event line of ``path`` (0 when there is none), so that a restarted
    server numbers on from it: a follower resuming with ``since=`` then misses nothing after a restart.
    Reads only the file's last ``tail_bytes``; a torn last line (a kill mid-write) is skipped."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail_bytes))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["seq"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0


class EventLog:
    """Thread-safe publisher: events are appended to ``path`` and fanned out to async subscribers.

    Args:
        path: JSONL file (appended to; ``None`` keeps events in memory only).
        capacity: how many recent events are kept for ``GET /api/v1/events?since=``.
    """

    def __init__(self, path: Path | None, capacity: int = 2000) -> None:
        self._path = path
        self._ring: deque[Event] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._subscribers: set[tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event]]] = set()
        self._seq = 0 if path is None else last_seq(path)
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")  # kept open: one write + flush per event
            if self._file.tell() and not path.read_bytes().endswith(b"\n"):
                self._file.write("\n")  # a torn last line (a kill mid-write) stays alone on its line

    def emit(self, kind: str, message: str, level: EventLevel = "info", **data: Any) -> Event:
        """Record an event (callable from any thread). Never pass secrets in ``message`` or ``data``.
        A ``tenant`` in ``data`` (a LoRA tenant's id) names the tenant the event concerns (`Event.tenant`);
        ``tenant=None`` is left out."""
        tenant = data.pop("tenant", None)
        if tenant is not None:
            data["tenant"] = tenant
        with self._lock:
            self._seq += 1
            event = Event(
                seq=self._seq,
                time=time.time(),
                level=level,
                kind=kind,
                message=message,
                data=data,
                tenant=tenant if isinstance(tenant, str) else None,
            )
            self._ring.append(event)
            if self._file is not None:
                self._file.write(json.dumps(event.model_dump()) + "\n")
                self._file.flush()
            subscribers = list(self._subscribers)
        for loop, q in subscribers:
            try:
                loop.call_soon_threadsafe(q.put_nowait, event)
            except RuntimeError:  # the subscriber's loop is closed
                continue
        return event

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def recent(self, since: int = 0) -> list[Event]:
        """Buffered events with ``seq > since``."""
        with self._lock:
            return [e for e in self._ring if e.seq > since]

    def subscribe(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event]]:
        """Register the running loop for live events; pair with :meth:`unsubscribe`."""
        handle = (asyncio.get_running_loop(), asyncio.Queue[Event]())
        with self._lock:
            self._subscribers.add(handle)
        return handle

    def subscribers(self) -> int:
        """How many live subscribers there are now."""
        with self._lock:
            return len(self._subscribers)

    def unsubscribe(self, handle: tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event]]) -> None:
        with self._lock:
            self._subscribers.discard(handle)


class TenantEventLog(EventLog):
    """A LoRA tenant's event log: its own file (``<run dir>/tenants/<id>/events.jsonl``, numbered on its
    own), each event also emitted on the server's log, both naming the tenant (`Event.tenant`), so that
    ``GET /api/v1/events`` carries a tenant's ``train.*`` and ``checkpoint.*`` events.

    Args:
        path: the tenant's JSONL file.
        server: the server's event log.
        tenant: the tenant's id.
    """

    def __init__(self, path: Path, server: EventLog, tenant: str) -> None:
        super().__init__(path)
        self.server, self.tenant = server, tenant

    def emit(self, kind: str, message: str, level: EventLevel = "info", **data: Any) -> Event:
        """Record the event in the tenant's file and on the server's log, ``data["tenant"]`` this tenant."""
        data["tenant"] = self.tenant
        self.server.emit(kind, message, level, **data)
        return super().emit(kind, message, level, **data)
