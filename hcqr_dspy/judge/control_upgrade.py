"""Adding the on-topic control to judgments that lack it: one judge call per question.

Judgments against the positive and the negative control only (``controls: true``, run folder format 1:
:mod:`hcqr_dspy.evaluation.folder_format`) hold the context's label and both control labels. Each of those calls
is independent of the others (:meth:`hcqr_dspy.judge.dur_judge.DURJudge.forward` labels the context and each control
in its own call), so with the same judge (LM, mode, reasoning) the missing on-topic control can be judged alone
and added: the recorded labels are kept as they are and each upgraded judgment says so (``on_topic_added``). The
added labels are written first to ``judgments_on_topic.jsonl`` (resumable, one record per question); when every
judgment has its control, they are merged into ``judgments.jsonl`` in one atomic rewrite and that file is removed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import dspy

from hcqr_dspy.data import format_options
from hcqr_dspy.errors import RunError
from hcqr_dspy.evaluation.answering import LM_UNAVAILABLE
from hcqr_dspy.evaluation.folder_format import lacks_on_topic_control as judged_before_on_topic
from hcqr_dspy.evaluation.loop import run_resumable
from hcqr_dspy.evaluation.records import JsonlTable, atomic_write_text
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.judge.controls import CONTROL_SEED, on_topic_contexts
from hcqr_dspy.judge.dur_judge import DURJudge, correct_answer_text
from hcqr_dspy.judge.labels import LABELS
from hcqr_dspy.lm import call_retrying_bad_replies
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.observers import Observer, observing

ADDED_FILE = "judgments_on_topic.jsonl"

ADDED_FIELDS = ("on_topic_label", "on_topic_rationale", "on_topic_option", "on_topic_passages", "on_topic_error")


def read_added(folder: RunFolder) -> dict[str, dict[str, Any]]:
    """The on-topic controls already added (``judgments_on_topic.jsonl``), checked, by question id.

    Raises:
        RunError: an unreadable record, one lacking a field or with a label that is not a DUR label, or a
            question added twice (the file and the record's position named).
    """
    table = JsonlTable(folder.path / ADDED_FILE, "judgment's added on-topic control")
    added: dict[str, dict[str, Any]] = {}
    for n, record in enumerate(table.read(), start=1):
        where = f"{table.path} (record {n}, question {record.get('qid')!r})"
        missing = [k for k in (*ADDED_FIELDS, "on_topic_seconds") if k not in record]
        if missing:
            raise RunError(f"{where} lacks {', '.join(missing)}; delete that line to judge it again")
        if record["on_topic_label"] is not None and record["on_topic_label"] not in LABELS:
            raise RunError(f"{where}: label {record['on_topic_label']!r} is not one of {', '.join(LABELS)}")
        if not isinstance(record["on_topic_seconds"], (int, float)) or not isinstance(
            record["on_topic_passages"], list
        ):
            raise RunError(f"{where}: on_topic_seconds must be a number and on_topic_passages a list")
        if record["qid"] in added:
            raise RunError(f"{where} is the second record of that question; keep one")
        added[record["qid"]] = record
    return added


def add_on_topic_controls(
    folder: RunFolder,
    retriever: Any,
    judge: DURJudge,
    lm: Any,
    questions: dict[str, Any],
    settings: dict[str, Any],
    num_threads: int = 1,
    progress: bool = True,
    traces: Observer | None = None,
    on_error: Callable[[Any, BaseException], BaseException] | None = None,
) -> list[dict[str, Any]]:
    """Judge the on-topic control of every judgment that lacks it (:func:`judged_before_on_topic`) and merge it in.

    Args:
        folder: The run folder whose ``judgments.jsonl`` holds such judgments.
        retriever: The run's retriever (resolves and retrieves the on-topic controls).
        judge: The judge (same mode and reasoning as the recorded judgments; the caller checks the settings).
        lm: The judge's ``dspy.LM``.
        questions: ``{qid: Question}`` of the run.
        settings: The settings the upgraded judgments are recorded with (``controls`` the current ones).
        num_threads, progress: See :func:`~hcqr_dspy.evaluation.loop.run_resumable`.
        traces: Told of each added control as a question named ``dur judge (on-topic control)`` tagged ``qid``
            (:class:`hcqr_dspy.observers.Observer`, installed while it runs); ``None``: nothing is recorded.
        on_error: Turns a question's exception (not a bad reply, not an outage) into the one raised.

    Returns:
        Every judgment of the folder, in file order, the upgraded ones with the on-topic fields and
        ``on_topic_added: true``.

    Raises:
        LMUnavailableError: the judge LM stopped answering (added controls so far kept in ``judgments_on_topic.jsonl``).
        RunError: a record could not be read or written, or an added control is malformed (:func:`read_added`).
    """
    done = folder.judgments()
    earlier = [j for j in done if judged_before_on_topic(j, settings)]
    if not earlier:
        return done
    rows = {r["qid"]: r for r in folder.rows()}
    controls = on_topic_contexts(
        retriever,
        [(j["qid"], questions[j["qid"]], len(rows[j["qid"]]["passages"])) for j in earlier],
        CONTROL_SEED,
    )

    def work(judgment: dict[str, Any]) -> dict[str, Any]:
        qid = judgment["qid"]
        q, topic = questions[qid], controls[qid]
        t0 = time.perf_counter()
        label = rationale = None
        if topic["documents"]:
            common = dict(
                question=q.question,
                options=format_options(q.options),
                correct_answer=correct_answer_text(q.options, q.answer),
            )
            if traces is None:
                label, rationale, _ = call_retrying_bad_replies(lambda: judge.label_context(common, topic["documents"]))
            else:
                with (
                    observing(traces),
                    traces.question("dur judge (on-topic control)", q.question, q.options, {"qid": qid}) as trace,
                ):
                    label, rationale, _ = call_retrying_bad_replies(
                        lambda: judge.label_context(common, topic["documents"])
                    )
                    trace.output({"on_topic_label": label})
        return {
            "qid": qid,
            "on_topic_label": label,
            "on_topic_rationale": rationale,
            "on_topic_option": topic["option"],
            "on_topic_passages": topic["passages"],
            "on_topic_error": topic["error"],
            "on_topic_seconds": round(time.perf_counter() - t0, 4),
        }

    table = JsonlTable(folder.path / ADDED_FILE, "judgment's added on-topic control")
    if {j["qid"] for j in earlier} - set(read_added(folder)):
        folder.record_session("judge: on-topic controls added", lm)
    with dspy.context(lm=lm, adapter=HCQRAdapter()):
        run_resumable(
            table, earlier, lambda j: j["qid"], work, LM_UNAVAILABLE, num_threads, progress, on_error=on_error
        )
    by_qid = read_added(folder)
    merged = []
    for j in done:
        extra = by_qid.get(j["qid"])
        if extra is not None and judged_before_on_topic(j, settings):
            j = {**j, **{k: extra[k] for k in ADDED_FIELDS}, "controls": settings["controls"], "on_topic_added": True}
            j["seconds"] = round((j.get("seconds") or 0) + extra["on_topic_seconds"], 4)
        merged.append(j)
    atomic_write_text(folder.judgments_table.path, "".join(json.dumps(j, ensure_ascii=False) + "\n" for j in merged))
    table.path.unlink()
    return merged
