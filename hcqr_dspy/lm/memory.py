"""What DSPy keeps in memory per LM call, bounded for runs of any length (:func:`bounded_lm_memory`).

Left to its defaults, DSPy keeps in the process, per LM call:

* its response cache's memory tier: an LRU of up to 1,000,000 replies (``dspy.configure_cache``'s
  ``memory_max_entries``) in front of the disk cache, which holds every reply anyway;
* that disk tier's SQLite page caches: ``diskcache``'s ``sqlite_cache_size`` of 8,192 pages (32 MB) in each of
  its 16 shards, per connection (the main thread's and each worker thread's), which fill as replies are written
  and read;
* that disk tier's memory-mapped files: ``diskcache``'s ``sqlite_mmap_size`` of 64 MiB in each shard, per
  connection; every page of a shard's file a connection reads through the map counts in the process's RSS, so
  this grows with the cache file up to 1 GiB a connection;
* a history entry (the messages, the reply, the call's arguments with the JSON adapter's ``response_format``
  model class) in the LM's ``history`` and in every calling module's ``history`` (up to
  ``dspy.settings.max_history_size``, 10,000 entries) and in ``dspy.clients.base_lm.GLOBAL_HISTORY`` (up to the
  module constant ``MAX_HISTORY_SIZE``, 10,000 entries, no setting);
* a trace entry (the predictor, its inputs and its prediction) in ``dspy.settings.trace`` (up to
  ``max_trace_size``, 10,000 entries), which only optimizers read.

:func:`bounded_lm_memory` bounds each when a run loop starts: the memory tier to :data:`MEMORY_CACHE_ENTRIES` (the
disk tier stays the cache of record), the disk tier's page caches to :data:`DISK_CACHE_PAGES` pages a shard, its
memory maps to :data:`DISK_CACHE_MMAP_BYTES` (off: SQLite reads the file into its bounded page cache), every
history to :data:`HISTORY_ENTRIES` entries, and turns the trace off (``docs/runs.md``, "Long runs", has what each
costs a question and the bound). The histories and the trace are bounded inside the loop alone; the memory tier
stays bounded for the rest of the process, and the disk tier's two settings are written into the cache folder
(``$DSPY_CACHEDIR``), so every later process that opens it, DSPy's own included, uses them too.
History stays on because :func:`hcqr_dspy.lm.adapter.finish_reasons` reads a call's finish reason from its entry
(nothing in the package reads costs or tokens from it: :mod:`hcqr_dspy.programs.costs` uses DSPy's usage tracker);
:data:`HISTORY_ENTRIES` leaves room for that many calls in flight between a call's entry and its read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from hcqr_dspy.errors import ResponseCacheError

MEMORY_CACHE_ENTRIES = 1000
"""Replies DSPy's in-memory response cache keeps during a run loop (least recently used dropped first)."""

DISK_CACHE_PAGES = 64
"""SQLite pages (4 KB each) the response cache's disk tier keeps cached per shard and connection (diskcache's
``sqlite_cache_size``; 16 shards: 4 MB a connection). Reads past it come from the operating system's file cache."""

DISK_CACHE_MMAP_BYTES = 0
"""Bytes of each shard's file the response cache's disk tier memory-maps per connection (diskcache's
``sqlite_mmap_size``, SQLite's ``PRAGMA mmap_size``): 0, none."""

HISTORY_ENTRIES = 64
"""LM calls DSPy's histories keep during a run loop: ``lm.history``, each module's ``history`` and
``GLOBAL_HISTORY``."""


def bound_response_cache(
    entries: int = MEMORY_CACHE_ENTRIES, pages: int = DISK_CACHE_PAGES, mmap_bytes: int = DISK_CACHE_MMAP_BYTES
) -> None:
    """Make DSPy's response cache (``dspy.cache``) hold at most ``entries`` replies in its memory tier, and ``pages``
    SQLite pages and ``mmap_bytes`` bytes of memory-mapped file per shard of its disk tier.

    The cache object is kept, with its class (:mod:`hcqr_dspy.lm.cache`, :mod:`hcqr_dspy.lm.reply_setup`) and its
    disk settings; its memory LRU is replaced by one of ``maxsize=entries`` (what
    ``dspy.configure_cache(memory_max_entries=entries)`` builds) holding up to ``entries`` of the replies it held.
    ``dspy.configure_cache`` itself would open a second handle on the disk folder and cannot carry over a pickle
    restriction, which the cache keeps only inside its disk tier. The disk tier's page cache and memory map are
    diskcache's own settings (``FanoutCache.reset("sqlite_cache_size", pages)``, ``reset("sqlite_mmap_size",
    mmap_bytes)``): stored in the cache folder's settings, so every connection opened on it from then on, in any
    thread or process, uses them (a connection another thread opened before keeps its own). A tier that is off, or a
    setting already that small, is left as it is.

    Raises:
        ResponseCacheError: the cache folder is not writable, or another process held it locked past diskcache's
            60 s retry (SQLite's ``OperationalError``).
    """
    import dspy
    from cachetools import LRUCache

    cache = dspy.cache
    memory = getattr(cache, "memory_cache", None)
    if getattr(cache, "enable_memory_cache", False) and isinstance(memory, LRUCache) and memory.maxsize > entries:
        bounded = LRUCache(maxsize=entries)
        with cache._lock:
            for key in list(memory.keys())[-entries:]:
                bounded[key] = memory[key]
            cache.memory_cache = bounded
    disk = getattr(cache, "disk_cache", None)
    if getattr(cache, "enable_disk_cache", False) and hasattr(disk, "reset"):
        try:
            if disk.sqlite_cache_size > pages:
                disk.reset("sqlite_cache_size", pages)
            if disk.sqlite_mmap_size > mmap_bytes:
                disk.reset("sqlite_mmap_size", mmap_bytes)
        except sqlite3.OperationalError as exc:
            raise ResponseCacheError(
                f"cannot bound DSPy's response cache in {disk.directory} ({exc}): the folder must be writable and "
                "not held by another process; set DSPY_CACHEDIR to another folder, or run again once it is free"
            ) from None


def trim_global_history(entries: int = HISTORY_ENTRIES) -> None:
    """Keep the last ``entries`` of DSPy's ``GLOBAL_HISTORY`` (DSPy bounds it by a module constant only)."""
    from dspy.clients.base_lm import GLOBAL_HISTORY

    if len(GLOBAL_HISTORY) > entries:
        del GLOBAL_HISTORY[:-entries]


@contextmanager
def bounded_lm_memory() -> Iterator[None]:
    """Bound what DSPy keeps per LM call inside the block (a run loop; threads DSPy's ``ParallelExecutor`` starts
    inherit it): the response cache's memory tier, disk page caches and memory maps (:func:`bound_response_cache`:
    for the process and, on disk, for the cache folder), the histories' size
    (``dspy.settings.max_history_size = HISTORY_ENTRIES``) and no DSPy trace (``max_trace_size = 0``). Call
    :func:`trim_global_history` after each item: ``GLOBAL_HISTORY`` has no setting.

    Raises:
        ResponseCacheError: the response cache folder cannot take the bounds (:func:`bound_response_cache`).
    """
    import dspy

    bound_response_cache()
    trim_global_history()
    with dspy.context(max_history_size=HISTORY_ENTRIES, max_trace_size=0):
        yield
