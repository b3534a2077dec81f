"""Judging a run folder: which questions, each question's context and controls, ``judgments.jsonl`` and ``dur.json``.

The judge (:class:`~hcqr_dspy.judge.dur_judge.DURJudge`) sees exactly the context the answer step saw: the row's
shown passages (after the token budget; a cut passage cut where it was cut,
:func:`hcqr_dspy.programs.context.shown_documents`), never the passages fusion kept but the budget dropped. Each
judgment records the judge's settings (LM, mode, reasoning, controls); a resumed judging with other settings is
refused. Each question's on-topic control is retrieved with the same retriever that resolves the run's passages
(the run's index; :func:`hcqr_dspy.judge.controls.on_topic_contexts`). Recording a judging in MLflow is
:mod:`hcqr_dspy.workflows.judge`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import dspy

from hcqr_dspy.data import select
from hcqr_dspy.errors import ProgramError, RunError
from hcqr_dspy.evaluation.answering import LM_UNAVAILABLE
from hcqr_dspy.evaluation.evidence import mentions
from hcqr_dspy.evaluation.loop import run_resumable
from hcqr_dspy.evaluation.outages import lm_failure
from hcqr_dspy.evaluation.run_folder import DUR_METRICS, RunFolder
from hcqr_dspy.judge.control_upgrade import add_on_topic_controls, judged_before_on_topic
from hcqr_dspy.judge.controls import CONTROL_SEED, negative_control_pairs, on_topic_contexts
from hcqr_dspy.judge.dur_judge import DURJudge
from hcqr_dspy.judge.dur_metrics import dur_metrics
from hcqr_dspy.judge.labels import LABELS
from hcqr_dspy.lm import call_retrying_bad_replies
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.observers import Observer, observing
from hcqr_dspy.programs.context import shown_documents
from hcqr_dspy.retrieval.retriever_base import Retriever, read_manifest

# The controls judged with each question, as recorded in every judgment's settings (a judging resumed with
# judgments recorded under other settings is refused, except judgments recorded with ``controls: true``, which
# hold no on-topic control and gain it: :mod:`hcqr_dspy.judge.control_upgrade`).
JUDGED_CONTROLS = "positive,negative,on_topic"


def judged_sample(
    folder: RunFolder, limit: int | None = None, seed: int = 0, ids: Sequence[str] | None = None
) -> dict[str, Any] | None:
    """Which of a run's questions to judge, when not all: judging costs an LM call per context and control.

    ``ids`` names them; else ``limit`` draws a seeded sample from the run's whole
    question sample (:meth:`RunFolder.question_sample`, finished or not) with
    :func:`hcqr_dspy.data.select`, the rule of ``hcqr eval --limit``: runs over
    the same questions get the same sample however far each has got, so their
    DUR is paired.

    Returns:
        ``None`` (judge all), or ``{"limit", "seed", "ids"}`` (``ids`` in run order).

    Raises:
        RunError: ids the run's dataset does not hold, an empty id list, or a
            sample that cannot be rebuilt.
    """
    if ids is None and limit is None:
        return None
    if ids is not None:
        wanted = [str(i) for i in ids]
        if not wanted:
            raise RunError("the list of question ids to judge is empty")
        known = folder.load_questions()
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise RunError(f"{folder.path}: question id(s) {', '.join(unknown[:5])} are not in {folder.dataset}")
        return {"limit": None, "seed": None, "ids": list(dict.fromkeys(wanted))}
    sample = folder.question_sample()
    chosen = select([dspy.Example(qid=q) for q in sample], limit=limit, seed=seed)
    return {"limit": limit, "seed": seed, "ids": [e.qid for e in chosen]}


def judge_run(
    run: str | Path | RunFolder,
    retriever: Retriever,
    lm: Any,
    mode: Literal["context", "passage"] = "context",
    reasoning: bool = True,
    judge_lm: str | None = None,
    num_threads: int = 1,
    progress: bool = True,
    traces: Observer | None = None,
    limit: int | None = None,
    seed: int = 0,
    ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Judge every question of a finished (or partial) run, or a sample of them, with controls; write
    ``judgments.jsonl`` and ``dur.json``.

    Each judgment holds the context's label and the positive, negative and on-topic control labels
    (``<control>_label`` / ``<control>_rationale``; the on-topic control's distractor letter, passage ids and,
    when none could be built, why: ``on_topic_option``, ``on_topic_passages``, ``on_topic_error``).

    Questions without shown passages (CoT, or nothing retrieved) are not
    judged. Judging resumes: questions already in ``judgments.jsonl`` are
    skipped, if they were judged with the same settings. With a sample
    (:func:`judged_sample`), only its questions the run has answered are
    judged, negative controls come from the sample's own contexts, and
    ``dur.json`` covers the sample and says so under ``sample``.

    Args:
        run: The run folder.
        retriever: Resolves passage ids and retrieves the on-topic controls (the run's index).
        lm: The judge's ``dspy.LM``.
        mode: ``"context"`` or ``"passage"``.
        reasoning: The judge reasons before it labels.
        judge_lm: The judge's LM spec, recorded (default: the LM's model name).
        num_threads: Judgments in flight.
        progress: Progress bar.
        traces: Told of each question's judging (the judge's calls and its controls) as a question named
            ``dur judge`` tagged ``qid``, and installed while it runs (:class:`hcqr_dspy.observers.Observer`; an
            MLflow trace with :class:`hcqr_dspy.tracking.question_traces.QuestionTraces`); its record's id is kept
            in the judgment as ``judge_trace_id``. ``None``: nothing is recorded.
        limit, seed, ids: Judge only these questions (:func:`judged_sample`); default all.

    Returns:
        DUR metrics (see :func:`dur_metrics`) with the judge's settings under ``judge``.

    Raises:
        RunError: no predictions, unreadable dataset, or judgments made with other settings.
        LMUnavailableError: the judge LM stopped answering (judgments so far kept).
        ProgramError: the judging code raised something that is not a bad judge reply.
    """
    folder = run if isinstance(run, RunFolder) else RunFolder.open(run)
    rows = folder.rows()
    if not rows:
        raise RunError(f"{folder.path} has no finished question; run `hcqr eval` first")
    questions = folder.load_questions()
    unlabelled = [r["qid"] for r in rows if questions[r["qid"]].answer is None]
    if unlabelled:
        raise RunError(
            f"{folder.path}: {len(unlabelled)} question(s) have no gold answer "
            f"({', '.join(unlabelled[:5])}); "
            "the DUR judge needs the correct answer"
        )
    settings = {
        "judge_lm": judge_lm or getattr(lm, "model", str(lm)),
        "mode": mode,
        "reasoning": bool(reasoning),
        "controls": JUDGED_CONTROLS,
        "control_seed": CONTROL_SEED,
    }
    done = folder.judgments()
    other = [j for j in done if {k: j.get(k) for k in settings} != settings and not judged_before_on_topic(j, settings)]
    if other:
        old = {k: other[0].get(k) for k in settings}
        raise RunError(
            f"{folder.judgments_table.path} holds judgments made with other settings ({old}); "
            f"these would be {settings}; delete it (and dur.json) to judge again"
        )
    judge = DURJudge(mode, reasoning)

    def bug(row: dict[str, Any], exc: BaseException) -> ProgramError:
        tb = folder.save_traceback(f"judge-{row['qid']}", exc)
        return ProgramError(
            f"judging question {row['qid']!r} raised {lm_failure(exc)} (traceback in {tb}); "
            "fix it and run the same command again to resume",
            row["qid"],
            tb,
        )

    if any(judged_before_on_topic(j, settings) for j in done):
        done = add_on_topic_controls(
            folder, retriever, judge, lm, questions, settings, num_threads, progress, traces, on_error=bug
        )
    sample = judged_sample(folder, limit=limit, seed=seed, ids=ids)
    chosen = None if sample is None else set(sample["ids"])
    todo = [r for r in rows if r.get("passages") and (chosen is None or r["qid"] in chosen)]
    if sample is not None and not todo:
        raise RunError(
            f"{folder.path}: none of the {len(chosen)} questions chosen to judge has been answered with a context yet"
        )

    def gold_in(qid: str, row: dict[str, Any]) -> bool:
        q = questions[qid]
        return mentions(q.options[q.answer], [retriever.get(p["id"]).text for p in row["passages"]])

    donors = negative_control_pairs(todo, gold_in)
    by_qid = {r["qid"]: r for r in todo}
    judged_before = {j["qid"] for j in done}
    on_topic = on_topic_contexts(
        retriever,
        [(r["qid"], questions[r["qid"]], len(r["passages"])) for r in todo if r["qid"] not in judged_before],
        CONTROL_SEED,
    )

    def judged(row: dict[str, Any]) -> dict[str, Any]:
        if traces is None:
            return work(row)
        q = questions[row["qid"]]
        with observing(traces), traces.question("dur judge", q.question, q.options, {"qid": row["qid"]}) as trace:
            record = work(row)
            keys = ("label", "rationale", "positive_label", "negative_label", "on_topic_label")
            trace.output({k: record[k] for k in keys})
            record["judge_trace_id"] = trace.trace_id
        return record

    def work(row: dict[str, Any]) -> dict[str, Any]:
        q = questions[row["qid"]]
        donor = donors.get(row["qid"])
        topic = on_topic[row["qid"]]

        def attempt():
            return judge(
                question=q.question,
                options=q.options,
                answer=q.answer,
                documents=shown_documents(retriever, row["passages"]),
                negative_documents=shown_documents(retriever, by_qid[donor]["passages"]) if donor else None,
                on_topic_documents=topic["documents"] or None,
            )

        t0 = time.perf_counter()
        pred = call_retrying_bad_replies(attempt)  # a gateway's HTML page is an outage, retried, as in eval
        return {
            "qid": row["qid"],
            **settings,
            "label": pred.label,
            "valid": pred.label in LABELS,
            "error": pred.error,
            "rationale": pred.rationale,
            "passage_labels": pred.passage_labels,
            "passage_rationales": pred.passage_rationales,
            "passage_queries": [p.get("queries") or [] for p in row["passages"]],
            "positive_label": pred.positive_label,
            "positive_rationale": pred.positive_rationale,
            "negative_label": pred.negative_label,
            "negative_rationale": pred.negative_rationale,
            "negative_from": donor,
            "on_topic_label": pred.on_topic_label,
            "on_topic_rationale": pred.on_topic_rationale,
            "on_topic_option": topic["option"],
            "on_topic_passages": topic["passages"],
            "on_topic_error": topic["error"],
            "stages": pred.stages,
            "seconds": round(time.perf_counter() - t0, 4),
        }

    if {r["qid"] for r in todo} - {j["qid"] for j in done}:
        folder.record_session("judge", lm)
    with dspy.context(lm=lm, adapter=HCQRAdapter()):
        judgments, _, _ = run_resumable(
            folder.judgments_table,
            todo,
            lambda r: r["qid"],
            judged,
            LM_UNAVAILABLE,
            num_threads,
            progress,
            on_error=bug,
        )
    metrics = {**dur_metrics(judgments), "judge": settings}
    if sample is not None:
        metrics["sample"] = {
            **sample,
            "n": len(sample["ids"]),
            "answered_with_context": len(todo),
            "run_answered_with_context": sum(bool(r.get("passages")) for r in rows),
        }
    folder.write_json(DUR_METRICS, metrics)
    return metrics


def judgeable(folder: RunFolder) -> bool:
    """Whether any answered question of the run has a retrieved context to judge (CoT runs have none)."""
    return any(r.get("passages") for r in folder.rows())


def check_judge_index(folder: RunFolder, index: str | Path | None = None) -> str | Path:
    """The index to resolve a run's passages with: ``index``, else the run's own; refused when it was
    built from another corpus than the run's (its passage ids would name other passages, or none).

    Raises:
        RunError: no index recorded or given, or a corpus fingerprint that differs from the run's.
    """
    path = index or folder.index_path
    if not path:
        raise RunError(f"{folder.path}: the run records no index; give --index")
    want = (folder.config.get("index") or {}).get("corpus_fingerprint")
    have = read_manifest(path, verify_files=False)["corpus"]["fingerprint"]
    if want and have != want:
        raise RunError(
            f"index {path} was built from another corpus (fingerprint {have[:12]}) than run {folder.path} "
            f"retrieved from ({want[:12]}); give the --index it was run with"
        )
    return path
