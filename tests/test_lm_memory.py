"""What DSPy keeps in memory per LM call stays bounded in a run loop (hcqr_dspy/lm/memory.py): its histories, its
trace, its response cache's memory tier and its disk tier's SQLite page caches and memory maps, whatever the number of
questions; a reply cut at max_tokens is still found a truncated one (its finish reason is read from the bounded
history); a cache folder that cannot take the bounds stops the run before its first question, in one line."""

import sqlite3
import threading
import uuid

import dspy
import pytest
from dspy.clients.base_lm import GLOBAL_HISTORY
from dspy.clients.cache import Cache
from dspy.utils import DummyLM
from helpers import SchemaEngine

from hcqr_dspy.data import check_question
from hcqr_dspy.errors import ResponseCacheError
from hcqr_dspy.evaluation.answering import evaluate
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.lm.cache import key_cache_by_endpoint
from hcqr_dspy.lm.memory import (
    DISK_CACHE_MMAP_BYTES,
    DISK_CACHE_PAGES,
    HISTORY_ENTRIES,
    MEMORY_CACHE_ENTRIES,
    bound_response_cache,
)
from hcqr_dspy.programs import CoT

OPTIONS = {"A": "alpha", "B": "beta", "C": "gamma"}
QUESTIONS = HISTORY_ENTRIES + 16  # more LM calls than the histories may keep


def questions(n):
    return [
        check_question(f"q{i}", {"question": f"Question number {i}?", "options": OPTIONS, "answer": "ABC"[i % 3]}, "t")
        for i in range(n)
    ]


class CutEngine(SchemaEngine):
    """Replies with a JSON object cut after its answer letter, finish reason ``length`` (a reply stopped at
    max_tokens): DSPy alone would repair it into a whole answer."""

    def complete(self, request):
        from dspy.lm15 import Message, Response, TextPart, Usage

        return Response(
            id=None,
            model="cut",
            message=Message.assistant([TextPart('{"reasoning": "r", "answer": "A')]),
            finish_reason="length",
            usage=Usage(input_tokens=100, output_tokens=12, total_tokens=112),
        )


def test_a_run_loop_keeps_dspy_histories_trace_and_memory_cache_bounded(tmp_path):
    lm = DummyLM(
        {f"Question number {i}?": {"reasoning": "r", "answer": "ABC"[i % 3]} for i in range(QUESTIONS)},
        adapter=dspy.JSONAdapter(),
    )
    program = CoT()
    trace_before = len(dspy.settings.trace)
    seen = []

    def inside(row):  # the settings a question of the loop runs under
        seen.append((dspy.settings.max_history_size, dspy.settings.max_trace_size, dspy.cache.memory_cache.maxsize))

    folder = RunFolder.create(tmp_path / "run", {"method": "cot", "dataset": "t"})
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        result = evaluate(program, questions(QUESTIONS), folder, "cot", progress=False, on_row=inside)
    assert result.ran == QUESTIONS and all(r["correct"] for r in result.rows)
    assert set(seen) == {(HISTORY_ENTRIES, 0, MEMORY_CACHE_ENTRIES)}
    assert len(lm.history) == HISTORY_ENTRIES  # one LM call a question: the oldest were dropped
    assert all(len(p.history) <= HISTORY_ENTRIES for p in program.predictors())
    assert len(GLOBAL_HISTORY) <= HISTORY_ENTRIES
    assert len(dspy.settings.trace) == trace_before  # no DSPy trace kept
    assert dspy.cache.memory_cache.maxsize == MEMORY_CACHE_ENTRIES  # bounded for the process
    assert dspy.cache.disk_cache.sqlite_cache_size == DISK_CACHE_PAGES
    assert dspy.cache.disk_cache.sqlite_mmap_size == DISK_CACHE_MMAP_BYTES


def test_a_reply_cut_at_max_tokens_is_still_found_truncated_in_a_bounded_parallel_loop(tmp_path):
    lm = dspy.LM(f"cut/{uuid.uuid4().hex}", engine=CutEngine(), temperature=0.0, max_tokens=12, cache=False)
    folder = RunFolder.create(tmp_path / "run", {"method": "cot", "dataset": "t"})
    with dspy.context(lm=lm, adapter=HCQRAdapter()):
        result = evaluate(CoT(), questions(QUESTIONS), folder, "cot", num_threads=4, progress=False)
    assert result.ran == QUESTIONS and len(lm.history) <= HISTORY_ENTRIES
    assert {(r["valid"], r["invalid_cause"]) for r in result.rows} == {(False, "truncated")}


def test_bounding_the_memory_cache_keeps_the_cache_its_class_its_disk_and_its_last_replies(tmp_path, monkeypatch):
    cache = Cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(tmp_path / "c"))
    monkeypatch.setattr(dspy, "cache", cache)
    key_cache_by_endpoint()  # hcqr's key (the endpoint too): its class must survive the bound
    keyed = type(cache)
    requests = [{"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(10)]
    for i, request in enumerate(requests):
        cache.put(request, f"reply {i}")
    bound_response_cache(4, pages=16, mmap_bytes=4096)
    assert dspy.cache is cache and type(cache) is keyed and cache.memory_cache.maxsize == 4
    assert sorted(cache.memory_cache.values()) == ["reply 6", "reply 7", "reply 8", "reply 9"]
    assert [cache.get(r) for r in requests] == [f"reply {i}" for i in range(10)]  # the disk tier holds every one
    bound_response_cache(8, pages=32, mmap_bytes=8192)  # tiers already smaller are left as they are
    assert cache.memory_cache.maxsize == 4 and cache.disk_cache.sqlite_cache_size == 16
    assert cache.disk_cache.sqlite_mmap_size == 4096
    pragmas = []  # a connection another thread opens on the disk tier (DSPy's worker threads) uses the settings too
    shard = cache.disk_cache._shards[0]
    worker = threading.Thread(
        target=lambda: pragmas.extend(shard._sql(f"PRAGMA {p}").fetchone()[0] for p in ("cache_size", "mmap_size"))
    )
    worker.start()
    worker.join()
    assert pragmas == [16, 4096]


def test_a_memory_tier_that_is_off_stays_off(tmp_path, monkeypatch):
    cache = Cache(enable_disk_cache=True, enable_memory_cache=False, disk_cache_dir=str(tmp_path / "c"))
    monkeypatch.setattr(dspy, "cache", cache)
    bound_response_cache(4)
    assert cache.memory_cache == {} and not cache.enable_memory_cache


def test_a_cache_folder_that_cannot_take_the_bounds_stops_the_run_before_its_first_question(tmp_path, monkeypatch):
    cache = Cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(tmp_path / "c"))
    monkeypatch.setattr(dspy, "cache", cache)
    shard = cache.disk_cache._shards[3]

    def read_only(key, value=None, update=True):  # SQLite's reply when the folder is read-only for this user
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(shard, "reset", read_only)
    folder = RunFolder.create(tmp_path / "run", {"method": "cot", "dataset": "t"})
    lm = DummyLM([{"reasoning": "r", "answer": "A"}] * 4)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()), pytest.raises(ResponseCacheError) as caught:
        evaluate(CoT(), questions(4), folder, "cot", progress=False)
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "c") in message and "readonly database" in message
    assert "DSPY_CACHEDIR" in message and not lm.history  # nothing was asked
