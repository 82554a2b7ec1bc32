"""Returning freed heap memory to the operating system (CPU runs).

A CPU forward or training step frees its activations when it ends, but glibc's allocator keeps the
pages mapped: without trimming, a server's resident size stays at the high-water mark of its largest
batch (measured: 4.3 GB instead of 1.1 GB after a LoRA step; 3.9 GB instead of 1.3 GB after sampling
16 who-is-the-spy games through LoRA adapters).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

__all__ = ["return_freed_memory"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    return trim


def return_freed_memory() -> bool:
    """Hand the heap pages freed so far back to the OS (glibc ``malloc_trim(0)``).

    Returns:
        ``True`` when glibc trimmed; ``False`` where there is no ``malloc_trim`` (a no-op).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
