"""A re-entrant thread lock whose priority holders go before its queued holders.

Why: a plain lock taken in a loop (the hf engine's worker, batch after batch; tenants' steps, one after
another) is taken back by the looping threads before an occasional caller that waits for it wins it: a
tenant's create waited 54 s under load behind sampling and steps (a fresh user's check of issue 36).

What: :meth:`PriorityLock.first` holds the lock before any :meth:`PriorityLock.after_first` that queues
for it: while a ``first`` caller waits, ``after_first`` callers do not take the lock, so the ``first``
caller waits for the current holder at most. ``after_first`` from the thread that holds the lock does not
wait (re-entrant). Plain ``with lock:`` and :meth:`acquire`/:meth:`release` take the lock with no priority
either way (as ``threading.RLock``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import TracebackType


class PriorityLock:
    """A ``threading.RLock`` with a priority way in (:meth:`first`) and a yielding one (:meth:`after_first`).

    Attributes:
        _owner: the ``threading.get_ident()`` of the holding thread, ``None`` while the lock is free.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition(threading.Lock())
        self._waiting_first = 0
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (re-entrant) with no priority; ``blocking``/``timeout`` as ``RLock.acquire``."""
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner = threading.get_ident()
        self._depth += 1
        return True

    def release(self) -> None:
        """Release one hold.

        Raises:
            RuntimeError: this thread holds none (as ``RLock.release``).
        """
        if self._owner != threading.get_ident():
            raise RuntimeError("cannot release a PriorityLock this thread does not hold")
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    @contextlib.contextmanager
    def first(self) -> Iterator[None]:
        """Hold the lock before any :meth:`after_first` caller that queues for it."""
        with self._changed:
            self._waiting_first += 1
        try:
            self.acquire()
        finally:
            with self._changed:
                self._waiting_first -= 1
                self._changed.notify_all()
        try:
            yield
        finally:
            self.release()

    @contextlib.contextmanager
    def after_first(self) -> Iterator[None]:
        """Hold the lock once no :meth:`first` caller waits (at once where this thread holds it already)."""
        if self._owner != threading.get_ident():
            with self._changed:
                self._changed.wait_for(lambda: self._waiting_first == 0)
        with self:
            yield
