"""Evaluation: rows written as they go, invalid answers counted, resume after an LM outage, a kill or a bug."""

import json
import os

import dspy
import pytest
from dspy.utils import DummyLM
from dspy.utils.exceptions import LMTransportError

from hcqr_dspy.data import check_question
from hcqr_dspy.errors import DiskFullError, LMUnavailableError, ProgramError, RunError
from hcqr_dspy.evaluation.answering import evaluate
from hcqr_dspy.evaluation.run_folder import PREDICTIONS, RunFolder
from hcqr_dspy.programs import CoT

CONFIG = {"method": "cot", "dataset": "bench.json"}

OPTIONS = {"A": "alpha", "B": "beta", "C": "gamma"}


def questions(n=6):
    return [
        check_question(f"q{i}", {"question": f"Question number {i}?", "options": OPTIONS, "answer": "ABC"[i % 3]}, "t")
        for i in range(n)
    ]


def lm_answering(letter_for):
    """DummyLM answering by question number; letter_for(i) -> letter (or junk)."""
    return DummyLM(
        {f"Question number {i}?": {"reasoning": "r", "answer": letter_for(i)} for i in range(20)},
        adapter=dspy.JSONAdapter(),
    )


class CountingCoT(CoT):
    """CoT that counts calls and can fail with an LM outage on chosen questions."""

    def __init__(self, down_on=()):
        super().__init__()
        self.calls = []
        self.down_on = set(down_on)

    def forward(self, question, options):
        self.calls.append(question)
        if question in self.down_on:
            raise LMTransportError("connection refused", model="dummy")
        return super().forward(question, options)


def run(program, qs, run_dir, lm):
    folder = RunFolder.create(run_dir, CONFIG)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        return evaluate(program, qs, folder, "cot", progress=False)


def read_rows(path):
    return RunFolder(path.parent).rows()


def test_rows_metrics_and_invalid_counted(tmp_path):
    lm = lm_answering(lambda i: "A" if i < 3 else "not-a-letter")
    result = run(CountingCoT(), questions(6), tmp_path, lm)
    rows = read_rows(tmp_path / PREDICTIONS)
    assert [r["qid"] for r in rows] == [f"q{i}" for i in range(6)]
    assert [r["valid"] for r in rows] == [True, True, True, False, False, False]
    assert all(r["prediction"] is None for r in rows[3:])  # never mapped to a default letter
    assert all(
        (r["invalid_stage"], r["invalid_cause"]) == ("answer", "unparseable") for r in rows[3:]
    )  # outside Literal[A, B, C]
    m = result.metrics
    assert m["invalid_answer_unparseable"] == 3
    assert m["n"] == 6 and m["correct"] == 1 and m["invalid"] == 3
    assert m["accuracy"] == pytest.approx(1 / 6) and m["invalid_rate"] == 0.5
    assert m["accuracy_se"] == pytest.approx((1 / 6 * 5 / 6 / 6) ** 0.5)
    assert m["mean_lm_calls"] == 1.0
    assert json.loads((tmp_path / "metrics.json").read_text())["n"] == 6


def test_lm_outage_stops_cleanly_and_resume_gives_same_totals(tmp_path):
    qs = questions(6)
    letters = lambda i: "ABC"[(i * 2) % 3]  # noqa: E731 - some right, some wrong
    first = CountingCoT(down_on={"Question number 3?"})
    with pytest.raises(LMUnavailableError, match=r"3/6 questions are saved .*run the same command again"):
        run(first, qs, tmp_path / "run", lm_answering(letters))
    assert [r["qid"] for r in read_rows(tmp_path / "run" / PREDICTIONS)] == ["q0", "q1", "q2"]
    assert len(first.calls) == 4  # stopped at the outage, did not go on

    second = CountingCoT()
    resumed = run(second, qs, tmp_path / "run", lm_answering(letters))
    assert second.calls == [f"Question number {i}?" for i in (3, 4, 5)]
    assert resumed.resumed == 3 and resumed.ran == 3

    fresh = run(CountingCoT(), qs, tmp_path / "fresh", lm_answering(letters))
    untimed = lambda m: {k: v for k, v in m.items() if "seconds" not in k and "cpu_pressure" not in k}  # noqa: E731
    assert untimed(resumed.metrics) == untimed(fresh.metrics)
    assert [(r["qid"], r["prediction"], r["correct"]) for r in resumed.rows] == [
        (r["qid"], r["prediction"], r["correct"]) for r in fresh.rows
    ]


def test_disk_full_mid_run_stops_and_says_so(tmp_path, monkeypatch):
    import hcqr_dspy.evaluation.records as ev

    real_fsync, calls = ev.os.fsync, []

    def fsync(fd):  # the second row's write fails as on a full disk
        if os.readlink(f"/proc/self/fd/{fd}").endswith(PREDICTIONS):
            calls.append(fd)
            if len(calls) > 1:
                raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(ev.os, "fsync", fsync)
    program = CountingCoT()
    with pytest.raises(
        DiskFullError,
        match=r"^the disk is full \(No space left on device: .*predictions.jsonl\); 1/4 questions are saved "
        r".*free space and run the same command again to resume$",
    ):
        run(program, questions(4), tmp_path, lm_answering(lambda i: "A"))
    assert len(program.calls) == 2  # stopped at the failed write
    # the row whose write failed was cut back: the file holds whole lines only, the one saved row
    assert [r["qid"] for r in RunFolder(tmp_path).rows()] == ["q0"]
    assert (tmp_path / PREDICTIONS).read_bytes().endswith(b"\n")


def test_killed_run_partial_line_is_redone(tmp_path):
    qs = questions(3)
    run(CountingCoT(), qs[:2], tmp_path, lm_answering(lambda i: "A"))
    path = tmp_path / PREDICTIONS
    whole = path.read_text()
    path.write_text(whole + '{"qid": "q2", "method": "cot", "predi')  # killed mid-write
    program = CountingCoT()
    result = run(program, qs, tmp_path, lm_answering(lambda i: "A"))
    assert program.calls == ["Question number 2?"]
    assert [r["qid"] for r in result.rows] == ["q0", "q1", "q2"]
    assert all(line.startswith("{") and line.endswith("}") for line in path.read_text().splitlines())


def test_a_whole_last_record_without_its_newline_is_kept_not_redone(tmp_path):
    qs = questions(3)
    run(CountingCoT(), qs[:2], tmp_path, lm_answering(lambda i: "A"))
    path = tmp_path / PREDICTIONS
    path.write_bytes(path.read_bytes()[:-1])  # its final newline lost (an editor), the record whole
    program = CountingCoT()
    result = run(program, qs, tmp_path, lm_answering(lambda i: "A"))
    assert program.calls == ["Question number 2?"]  # q1 kept, only the new question run
    assert [r["qid"] for r in result.rows] == ["q0", "q1", "q2"]
    assert len(path.read_text().splitlines()) == 3 and path.read_bytes().endswith(b"\n")


class Buggy(CountingCoT):
    """CoT with a bug on one question (a TypeError), or fixed."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def forward(self, question, options):
        if question == "Question number 1?" and not self.fixed:
            self.calls.append(question)
            return len(None)  # TypeError: a bug in our code, not a bad LM reply
        return super().forward(question, options)


def test_a_bug_stops_the_run_with_one_line_and_a_saved_traceback_then_resumes_once_fixed(tmp_path):
    qs = questions(4)
    buggy = Buggy()
    with pytest.raises(
        ProgramError,
        match=r"question 'q1' raised TypeError: .*traceback in .*/tracebacks/q1-[0-9a-f]{16}\.txt.*this is a bug",
    ) as err:
        run(buggy, qs, tmp_path, lm_answering(lambda i: "A"))
    assert "\n" not in str(err.value)
    assert "len(None)" in err.value.traceback_file.read_text()  # the traceback, with the failing line
    assert [r["qid"] for r in read_rows(tmp_path / PREDICTIONS)] == ["q0"]  # nothing saved for q1, nothing after it
    assert buggy.calls == ["Question number 0?", "Question number 1?"]
    assert json.loads((tmp_path / "metrics.json").read_text())["n"] == 1

    fixed = Buggy(fixed=True)
    result = run(fixed, qs, tmp_path, lm_answering(lambda i: "A"))
    assert fixed.calls == [f"Question number {i}?" for i in (1, 2, 3)]
    assert [r["valid"] for r in result.rows] == [True] * 4 and result.resumed == 1
    assert not (tmp_path / "tracebacks").exists()  # the question succeeded: its stale traceback is gone


def test_long_or_colliding_question_ids_get_traceback_files_of_their_own(tmp_path, caplog):
    """A traceback file is named by a hash of the question id: a 5,000-character id (over a file name's 255 bytes)
    gets a file, and its row no error log; "a/b" and "a_b" get two files, and clearing one leaves the other."""
    import logging

    long_id = "q" * 5000

    def question(qid):  # every one "Question number 1?", the one Buggy fails on
        return check_question(qid, {"question": "Question number 1?", "options": OPTIONS, "answer": "A"}, "t")

    dspy_log = logging.getLogger("dspy")  # DSPy's executor logs a failed item there (not propagated to the root)
    dspy_log.addHandler(caplog.handler)
    try:
        saved = {}
        for qid in (long_id, "a/b", "a_b"):
            with pytest.raises(ProgramError, match="this is a bug") as err:
                run(Buggy(), [question(qid)], tmp_path, lm_answering(lambda i: "A"))
            saved[qid] = err.value.traceback_file
            assert saved[qid] is not None and saved[qid].parent == tmp_path / "tracebacks", str(err.value)[:300]
            assert len(saved[qid].name) <= 61
            head, _, rest = saved[qid].read_text(encoding="utf-8").partition("\n\n")
            assert head == "qid: " + json.dumps(qid) and "len(None)" in rest
        assert saved["a/b"] != saved["a_b"] and len(set(saved.values())) == 3
        assert sorted(p.name for p in (tmp_path / "tracebacks").iterdir()) == sorted(p.name for p in saved.values())

        # "a/b" fixed: its file goes, "a_b"'s stays
        run(Buggy(fixed=True), [question("a/b")], tmp_path, lm_answering(lambda i: "A"))
        assert not saved["a/b"].exists() and saved["a_b"].exists() and saved[long_id].exists()
        result = run(Buggy(fixed=True), [question(long_id), question("a_b")], tmp_path, lm_answering(lambda i: "A"))
    finally:
        dspy_log.removeHandler(caplog.handler)
    assert [r.getMessage()[:300] for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [(r["qid"], r["valid"]) for r in result.rows] == [(long_id, True), ("a_b", True)]
    assert {r["qid"] for r in read_rows(tmp_path / PREDICTIONS)} == {long_id, "a/b", "a_b"}
    assert not (tmp_path / "tracebacks").exists()


def test_run_folder_with_other_config_is_refused(tmp_path):
    RunFolder.create(tmp_path, {"method": "cot", "dataset": "d", "lm": {"spec": "local"}})
    RunFolder.create(tmp_path, {"method": "cot", "dataset": "d", "lm": {"spec": "local"}})  # same: reopened
    with pytest.raises(RunError, match=r"another configuration \(differs in: lm, method\)"):
        RunFolder.create(tmp_path, {"method": "hcqr", "dataset": "d", "lm": {"spec": "local:smollm2-135m"}})
    # a setting added later with its default (None) is no difference
    RunFolder.create(tmp_path, {"method": "cot", "dataset": "d", "lm": {"spec": "local", "new_option": None}})


def test_unusable_run_folder_fails_before_any_lm_call(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(RunError, match="is not writable"):
        RunFolder.create(blocker / "run", {"method": "cot", "dataset": "d"})
    with pytest.raises(RunError, match=r"run folder .*file is a file; give --run-dir a folder"):
        RunFolder.create(blocker, {"method": "cot", "dataset": "d"})


def test_corrupted_record_or_config_is_a_clear_error(tmp_path):
    path = tmp_path / PREDICTIONS
    path.write_text('{"qid": "q0"}\nnot json\n{"qid": "q2"}\n')
    with pytest.raises(RunError, match=r"predictions\.jsonl:2: not a valid record"):
        read_rows(path)
    path.write_bytes(b'{"qid": "q0"}\n{"qid": "caf\xe9"}\n')
    with pytest.raises(RunError, match=r"predictions\.jsonl:2: not valid UTF-8"):
        read_rows(path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(RunError, match=r"config\.json:1: not valid JSON"):
        RunFolder.create(tmp_path, {"method": "cot", "dataset": "d"})


def test_a_slow_question_among_the_last_is_run_and_recorded_once(tmp_path, monkeypatch):
    """DSPy's ParallelExecutor starts an item again once it has run ``timeout`` seconds (default 120) while at most
    ``straggler_limit`` remain; the loop must never run a question twice, nor record it twice (a slow remote LM
    with --threads 3 did). Here a 1 s default stands in for the 120 s one."""
    import time

    from dspy.utils.parallelizer import ParallelExecutor

    from hcqr_dspy.evaluation import loop
    from hcqr_dspy.evaluation.records import JsonlTable

    class Impatient(ParallelExecutor):
        def __init__(self, *args, timeout=1, **kwargs):
            super().__init__(*args, timeout=timeout, **kwargs)

    monkeypatch.setattr(loop, "ParallelExecutor", Impatient)
    calls = []

    def work(qid):
        calls.append(qid)
        time.sleep(2.5 if qid == "q1" else 0.1)
        return {"qid": qid}

    table = JsonlTable(tmp_path / PREDICTIONS, "question")
    rows, resumed, ran = loop.run_resumable(table, ["q0", "q1"], str, work, (), num_threads=2, progress=False)
    time.sleep(3)  # a second run of q1, had one started, would have finished and written by now
    assert sorted(calls) == ["q0", "q1"] and (resumed, ran) == (0, 2)
    assert [r["qid"] for r in rows] == ["q0", "q1"]
    assert [r["qid"] for r in read_rows(tmp_path / PREDICTIONS)] == ["q0", "q1"]
