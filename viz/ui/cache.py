"""A least-recently-used cache bounded in bytes (not only entries): pure Python, thread-safe.
Results derived from one trace are kept with that trace instead (core.head_maps.derived).

The app keeps traces in one of these; a minilm trace of 512 tokens is hundreds of MB, so a
count limit alone would not bound memory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


class ByteLRU:
    def __init__(self, max_bytes: int, max_entries: int = 256, size_of: Callable[[Any], int] = lambda v: v.nbytes()):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.size_of = size_of
        self._data: "OrderedDict[Hashable, tuple]" = OrderedDict()
        self._bytes = 0
        self._lock = threading.RLock()
        self._key_locks: dict = {}
        self.hits = self.misses = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key][0]
            return None

    def put(self, key, value) -> None:
        size = int(self.size_of(value))
        with self._lock:
            if key in self._data:
                self._bytes -= self._data.pop(key)[1]
            if size > self.max_bytes:
                return  # larger than the whole budget: served, never kept
            self._data[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes or len(self._data) > self.max_entries:
                _, (_, s) = self._data.popitem(last=False)
                self._bytes -= s

    def get_or_compute(self, key, compute: Callable[[], Any]):
        """The cached value, or compute it once even when several sessions ask at once."""
        hit = self.get(key)
        if hit is not None:
            return hit
        with self._lock:
            klock = self._key_locks.setdefault(key, threading.Lock())
        with klock:
            hit = self.get(key)
            if hit is not None:
                return hit
            self.misses += 1
            value = compute()
            self.put(key, value)
        with self._lock:
            self._key_locks.pop(key, None)
        return value

    def holds(self, value) -> bool:
        """Whether this very object is kept (the admission gate counts a held result once)."""
        with self._lock:
            return any(v is value for v, _ in self._data.values())

    def shrink_to(self, max_bytes: int, keep: Callable[[Any], bool] = lambda v: False) -> int:
        """Drop the least recently used entries until at most max_bytes are held, leaving those
        keep(value) spares (the admission gate's room for a job, viz/ui/gate.py: dropping a
        result a page still draws from frees nothing); returns the bytes freed."""
        freed = 0
        with self._lock:
            for key in list(self._data):
                if self._bytes <= max_bytes:
                    break
                value, s = self._data[key]
                if keep(value):
                    continue
                del self._data[key]
                self._bytes -= s
                freed += s
        return freed

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0
