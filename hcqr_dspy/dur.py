"""Decision-Useful Rate (DUR): an LM judge labels each question's retrieved context.

Labels (HCQR paper): ``ENTAILED`` — the context alone implies the gold
answer; ``USEFUL`` — strong support for the gold answer that needs a small
inference; ``NOT_USEFUL`` — otherwise. DUR = share of judged questions
labelled ENTAILED or USEFUL. A judge reply outside the three labels is an
*invalid judgment*: counted separately, never mapped to a label.

Two modes: ``context`` (one judgment over the fused context, as in the
paper) and ``passage`` (each passage judged alone, for finer attribution;
the context label is the best passage label). For HCQR runs, the role
shares say in how many decision-useful contexts a passage found by q1
(support), q2 (distinction) and q3 (key features) was present.

Judgments are written to ``judgments.jsonl`` in the run folder as they
finish, and resumed like evaluations.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

import dspy

from hcqr_dspy.data import format_options, load_questions
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluate import LM_UNAVAILABLE, PREDICTIONS, read_rows, resumable_map
from hcqr_dspy.programs.base import BAD_REPLY_ERRORS, stage
from hcqr_dspy.retrieval.base import Retriever
from hcqr_dspy.signatures import JudgeContext, JudgePassage

LABELS = ("ENTAILED", "USEFUL", "NOT_USEFUL")
USEFUL_LABELS = {"ENTAILED", "USEFUL"}
JUDGMENTS = "judgments.jsonl"
DUR_METRICS = "dur.json"
ROLE_NAMES = ("q1", "q2", "q3")


def correct_answer_text(options: dict[str, str], answer: str) -> str:
    return f"{answer}. {options[answer]}"


class DURJudge(dspy.Module):
    """Labels a question's retrieved passages with the DUR judge.

    Args:
        retriever: Resolves passage ids to text (same corpus as the run).
        mode: ``"context"`` (one call per question) or ``"passage"`` (one per passage).
    """

    def __init__(self, retriever: Retriever, mode: Literal["context", "passage"] = "context"):
        super().__init__()
        if mode not in ("context", "passage"):
            raise HCQRError(f"unknown DUR mode {mode!r}; choose context or passage")
        self.retriever = retriever
        self.mode = mode
        self.judge_context = dspy.Predict(JudgeContext)
        self.judge_passage = dspy.Predict(JudgePassage)

    def _doc(self, i: int, pid: str) -> str:
        p = self.retriever.get(pid)
        return f"Document [{i}] (Title: {p.title}) {p.content}"

    def forward(self, question: str, options: dict[str, str], answer: str, passage_ids: list[str]) -> dspy.Prediction:
        common = dict(question=question, options=format_options(options), correct_answer=correct_answer_text(options, answer))
        stages: dict = {}
        if self.mode == "context":
            context = "\n".join(self._doc(i, pid) for i, pid in enumerate(passage_ids, start=1))
            with stage(stages, "judge"):
                try:
                    label = self.judge_context(context=context, **common).label
                except BAD_REPLY_ERRORS as exc:
                    return dspy.Prediction(label=None, error=f"{type(exc).__name__}: {exc}"[:300], passage_labels=None, stages=stages)
            return dspy.Prediction(label=label, error=None, passage_labels=None, stages=stages)
        labels: list[str | None] = []
        errors = 0
        with stage(stages, "judge"):
            for i, pid in enumerate(passage_ids, start=1):
                try:
                    labels.append(self.judge_passage(passage=self._doc(i, pid), **common).label)
                except BAD_REPLY_ERRORS:
                    labels.append(None)
                    errors += 1
        valid = [lab for lab in labels if lab]
        if not valid:
            return dspy.Prediction(label=None, error="no valid passage judgment", passage_labels=labels, stages=stages)
        best = min(valid, key=LABELS.index)
        return dspy.Prediction(label=best, error=None, passage_labels=labels, stages=stages, passage_errors=errors)


def judge_run(
    run_dir: str | Path,
    retriever: Retriever,
    lm: Any,
    mode: Literal["context", "passage"] = "context",
    num_threads: int = 1,
    progress: bool = True,
) -> dict[str, float]:
    """Judge every question of a finished (or partial) run; write ``judgments.jsonl`` and ``dur.json``.

    Questions without retrieved passages (CoT, or invalid before retrieval)
    are not judged. Judging resumes: questions already in ``judgments.jsonl``
    are skipped.

    Returns:
        DUR metrics (see :func:`dur_metrics`).

    Raises:
        HCQRError: the run folder has no predictions, or its dataset cannot be read.
        LMUnavailableError: the judge LM stopped answering (judgments so far kept).
    """
    run_dir = Path(run_dir)
    rows = read_rows(run_dir / PREDICTIONS)
    if not rows:
        raise HCQRError(f"{run_dir} has no {PREDICTIONS}; run `hcqr eval` first")
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    questions = {q.qid: q for q in load_questions(config["dataset"])}
    judge = DURJudge(retriever, mode)
    todo = [r for r in rows if r.get("passages")]

    def work(row: dict[str, Any]) -> dict[str, Any]:
        q = questions[row["qid"]]
        t0 = time.perf_counter()
        try:
            pred = judge(question=q.question, options=q.options, answer=q.answer, passage_ids=[p["id"] for p in row["passages"]])
        except LM_UNAVAILABLE:
            raise
        except Exception as exc:  # one broken judgment must not end the run
            pred = dspy.Prediction(label=None, error=f"{type(exc).__name__}: {exc}"[:300], passage_labels=None, stages={})
        return {
            "qid": row["qid"],
            "mode": mode,
            "label": pred.label,
            "valid": pred.label in LABELS,
            "error": pred.error,
            "passage_labels": pred.get("passage_labels"),
            "passage_queries": [p["queries"] for p in row["passages"]],
            "stages": pred.stages,
            "seconds": round(time.perf_counter() - t0, 4),
        }

    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        judgments, _, _ = resumable_map(todo, lambda r: r["qid"], work, run_dir / JUDGMENTS, num_threads, progress)
    metrics = dur_metrics(judgments)
    (run_dir / DUR_METRICS).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics


def dur_metrics(judgments: list[dict[str, Any]]) -> dict[str, float]:
    """DUR and label shares over valid judgments; invalid judgments counted apart.

    Returns:
        ``dur_n`` (judged), ``dur_invalid``, ``dur`` (share ENTAILED or
        USEFUL among valid), ``dur_entailed`` / ``dur_useful`` /
        ``dur_not_useful`` shares, and for multi-query runs ``dur_role_q<i>``:
        among decision-useful contexts, the share holding a passage found by
        query i (in passage mode: a passage found by query i and itself
        labelled ENTAILED or USEFUL).
    """
    valid = [j for j in judgments if j["valid"]]
    out: dict[str, float] = {"dur_n": len(judgments), "dur_invalid": len(judgments) - len(valid)}
    if not valid:
        return out
    n = len(valid)
    for label in LABELS:
        out[f"dur_{label.lower()}"] = sum(j["label"] == label for j in valid) / n
    out["dur"] = out["dur_entailed"] + out["dur_useful"]
    useful = [j for j in valid if j["label"] in USEFUL_LABELS]
    n_queries = max((q for j in valid for qs in j["passage_queries"] for q in qs), default=-1) + 1
    if useful and n_queries > 1:
        for qi in range(n_queries):
            hits = 0
            for j in useful:
                if j.get("passage_labels"):
                    hits += any(qi in qs and lab in USEFUL_LABELS for qs, lab in zip(j["passage_queries"], j["passage_labels"]))
                else:
                    hits += any(qi in qs for qs in j["passage_queries"])
            out[f"dur_role_q{qi + 1}"] = hits / len(useful)
    return out
