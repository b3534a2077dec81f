"""How far the DUR judge agrees with contexts labelled by hand: the labelled set, judging it, agreement.

The controls of :mod:`hcqr_dspy.judge.controls` are built by rules; this is the check that is not. A
*labelled set* is a JSON Lines file of contexts, each labelled by a person with the judge's own rubric
(:data:`hcqr_dspy.programs.signatures.DUR_LABELS_DESC`) and a one-sentence reason. One line per
context::

    {"id": "demo-004-entailed", "qid": "demo-004", "passages": ["demo-0093", "demo-0121"],
     "label": "ENTAILED", "kind": "gold_evidence", "reason": "..."}

``qid`` names a question of the set's question file and ``passages`` passage ids of its corpus, in context
order; the judge sees them as the answer step would (``Document [i] (Title: ...) text``, whole passages),
with the question, its options and the gold option, and never ``kind`` or ``reason``. The shipped set
(:func:`default_labelled_set`, ``data/judge_labels/demo_contexts.jsonl`` in the repository) holds 40
contexts over the shipped demo questions and corpus (``data/demo/``), which are its default question file
and corpus; ``data/judge_labels/README.md`` says how they were chosen and labelled.

Agreement (:func:`agreement`) over the judge's valid labels (a reply outside the labels is counted apart
as invalid, never mapped to a label, as in DUR): accuracy with its 95% Wilson interval, Cohen's kappa with
its asymptotic standard error and 95% interval (``statsmodels.stats.inter_rater.cohens_kappa`` on the
hand-by-judge table of the three labels), the table itself, and the same two figures on the decision the
DUR counts (ENTAILED or USEFUL against NOT_USEFUL). ``hcqr compare`` flags a judge whose kappa interval
reaches down to chance (:func:`agreement_flags`, ``kappa_low_min`` of
:data:`hcqr_dspy.judge.controls.CONTROL_LIMITS`).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import dspy
from tqdm import tqdm

from hcqr_dspy.data import format_options, load_questions
from hcqr_dspy.errors import DataError, LMUnavailableError
from hcqr_dspy.evaluation.answering import LM_UNAVAILABLE
from hcqr_dspy.evaluation.outages import lm_failure
from hcqr_dspy.files import file_sha256
from hcqr_dspy.judge.controls import CONTROL_LIMITS
from hcqr_dspy.judge.dur_judge import DURJudge, correct_answer_text
from hcqr_dspy.judge.dur_metrics import wilson_interval
from hcqr_dspy.judge.labels import LABELS, USEFUL_LABELS
from hcqr_dspy.lm import call_retrying_bad_replies
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.programs.context import format_document
from hcqr_dspy.resources import shipped_dir

LABELLED_SET = "demo_contexts.jsonl"
# The agreement of the judge that judged a run, written into the run folder by `hcqr judge --labelled-set`.
AGREEMENT_FILE = "judge_agreement.json"
FIELDS = ("id", "qid", "passages", "label", "kind", "reason")


@dataclass(frozen=True)
class LabelledContext:
    """One hand-labelled context, resolved: the question, its options and gold letter, the passage ids and
    their formatted documents, and the hand label with its kind and reason."""

    id: str
    qid: str
    question: str
    options: dict[str, str]
    answer: str
    passages: tuple[str, ...]
    documents: tuple[str, ...]
    label: str
    kind: str
    reason: str


def default_labelled_set() -> Path:
    """The shipped labelled set (``hcqr_dspy/shipped/judge_labels/``, a link to ``data/judge_labels/``).

    Raises:
        DataError: this install does not hold it (give the file's path instead).
    """
    path = files("hcqr_dspy").joinpath("shipped", "judge_labels", LABELLED_SET)
    if not isinstance(path, Path) or not path.is_file():
        raise DataError(
            f"the hand-labelled set {LABELLED_SET} is not in this install ({path}); it is "
            "data/judge_labels/demo_contexts.jsonl in the repository: give its path"
        )
    return path


def load_labelled_set(
    path: str | Path | None = None, questions: str | Path | None = None, corpus: str | Path | None = None
) -> list[LabelledContext]:
    """Read and resolve a labelled set.

    Args:
        path: The JSON Lines file; default :func:`default_labelled_set`.
        questions: Its question file; default the shipped demo questions.
        corpus: Its corpus (``.jsonl``); default the shipped demo corpus.

    Returns:
        The contexts, in file order.

    Raises:
        DataError: unreadable file, a line that is not a JSON object with :data:`FIELDS`, a label outside
            the three, an id given twice, a question or passage its question file or corpus does not hold
            (each naming the file and line), or an empty set.
    """
    from hcqr_dspy.retrieval import load_corpus

    path = Path(path) if path is not None else default_labelled_set()
    demo = None if questions is not None and corpus is not None else shipped_dir("demo")
    asked = {q.qid: q for q in load_questions(questions or demo / "questions.json")}
    store = load_corpus(corpus or demo / "corpus.jsonl")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"labelled set {path}: cannot read it ({exc})") from None
    out: list[LabelledContext] = []
    seen: set[str] = set()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"labelled set {path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or any(k not in row for k in FIELDS):
            raise DataError(f"{where}: expected a JSON object with {', '.join(FIELDS)}")
        if row["label"] not in LABELS:
            raise DataError(f"{where}: label {row['label']!r} is not one of {', '.join(LABELS)}")
        if row["id"] in seen:
            raise DataError(f"{where}: id {row['id']!r} is given twice")
        seen.add(row["id"])
        q = asked.get(row["qid"])
        if q is None:
            raise DataError(f"{where}: question {row['qid']!r} is not in the question file")
        ids = row["passages"]
        if not isinstance(ids, list) or not ids or any(not isinstance(p, str) or p not in store for p in ids):
            raise DataError(f"{where}: passages must be a non-empty list of ids of the corpus; got {ids!r}")
        docs = tuple(format_document(i, store.get(p).title, store.get(p).content) for i, p in enumerate(ids, 1))
        out.append(
            LabelledContext(
                row["id"],
                q.qid,
                q.question,
                dict(q.options),
                q.answer,
                tuple(ids),
                docs,
                row["label"],
                row["kind"],
                row["reason"],
            )
        )
    if not out:
        raise DataError(f"labelled set {path} holds no context")
    return out


def judge_labelled_set(items: Sequence[LabelledContext], judge: DURJudge, progress: bool = True) -> list[dict]:
    """Judge each labelled context once with ``judge`` (its mode; no controls), under the LM and adapter the
    caller set with ``dspy.context``; a reply that is not the API's format is retried
    (:func:`hcqr_dspy.lm.call_retrying_bad_replies`).

    Returns:
        One record per context: ``id``, ``qid``, ``label`` (the hand label), ``judge_label`` (``None`` for an
        invalid reply), ``valid``, ``rationale``, ``error`` and in passage mode ``passage_labels``.
    """
    out = []
    for item in tqdm(items, desc="labelled set", disable=not progress):
        common = dict(
            question=item.question,
            options=format_options(item.options),
            correct_answer=correct_answer_text(item.options, item.answer),
        )
        judged = call_retrying_bad_replies(lambda item=item, common=common: judge.label(common, list(item.documents)))
        record = {
            "id": item.id,
            "qid": item.qid,
            "label": item.label,
            "judge_label": judged["label"],
            "valid": judged["label"] in LABELS,
            "rationale": judged["rationale"],
            "error": judged["error"],
        }
        if judged["passage_labels"] is not None:
            record["passage_labels"] = judged["passage_labels"]
        out.append(record)
    return out


def _finite(x: Any) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def _kappa(table: list[list[int]]) -> dict[str, Any]:
    """Cohen's kappa of a square table (rows: hand labels, columns: the judge's) by statsmodels, with its
    asymptotic standard error and 95% interval; ``None`` where undefined (one category only)."""
    import numpy as np
    from statsmodels.stats.inter_rater import cohens_kappa

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        res = cohens_kappa(np.asarray(table, dtype=float))
    kappa, se = _finite(res.kappa), _finite(res.std_kappa)
    lo, hi = _finite(res.kappa_low), _finite(res.kappa_upp)
    return {"kappa": kappa, "kappa_se": se, "kappa_ci": [lo, hi] if kappa is not None and lo is not None else None}


def _scores(hand: Sequence[str], judged: Sequence[str], categories: Sequence[str]) -> dict[str, Any]:
    correct = sum(h == j for h, j in zip(hand, judged))
    n = len(hand)
    table = [[sum(h == a and j == b for h, j in zip(hand, judged)) for b in categories] for a in categories]
    return {
        "correct": correct,
        "accuracy": correct / n if n else None,
        "accuracy_ci": list(wilson_interval(correct, n)) if n else None,
        **(_kappa(table) if n else {"kappa": None, "kappa_se": None, "kappa_ci": None}),
    }


def agreement(hand: Sequence[str], judged: Sequence[str | None]) -> dict[str, Any]:
    """The judge's agreement with hand labels, over the judge's valid labels.

    Args:
        hand: The hand labels.
        judged: The judge's labels, in the same order; ``None`` (or anything outside the labels) is invalid.

    Returns:
        ``n``, ``invalid``, ``valid``; on the three labels ``correct``, ``accuracy``, ``accuracy_ci`` (95%
        Wilson), ``kappa``, ``kappa_se``, ``kappa_ci`` (95%, ``kappa`` ± 1.96 ``kappa_se``; ``None`` where
        undefined); ``confusion`` (``{hand label: {judge label: count}}``); and ``useful``: the same figures on
        decision-useful (ENTAILED or USEFUL) against NOT_USEFUL.
    """
    pairs = [(h, j) for h, j in zip(hand, judged) if j in LABELS]
    h3, j3 = [h for h, _ in pairs], [j for _, j in pairs]
    useful = ("useful", "not_useful")
    h2 = [useful[h not in USEFUL_LABELS] for h in h3]
    j2 = [useful[j not in USEFUL_LABELS] for j in j3]
    return {
        "n": len(hand),
        "invalid": len(hand) - len(pairs),
        "valid": len(pairs),
        **_scores(h3, j3, LABELS),
        "confusion": {a: {b: sum(h == a and j == b for h, j in pairs) for b in LABELS} for a in LABELS},
        "useful": _scores(h2, j2, useful),
    }


def agreement_record(
    path: str | Path, items: Sequence[LabelledContext], judged: list[dict], judge: dict[str, Any]
) -> dict[str, Any]:
    """What ``judge_agreement.json`` holds: the set (path, SHA-256, size, hand labels per label), the judge's
    settings (``judge_lm``, ``mode``, ``reasoning``), :func:`agreement` and each context's judgment (``items``)."""
    counts = {label: sum(i.label == label for i in items) for label in LABELS}
    return {
        "labelled_set": {"path": str(path), "sha256": file_sha256(Path(path)), "n": len(items), "labels": counts},
        "judge": judge,
        **agreement([r["label"] for r in judged], [r["judge_label"] for r in judged]),
        "items": judged,
    }


def measure_agreement(
    lm: Any,
    judge_lm: str | None,
    mode: str = "context",
    reasoning: bool = True,
    path: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Judge a labelled set with ``lm`` (JSON adapter, as ``hcqr judge``) and measure the agreement.

    Args:
        lm: The judge's ``dspy.LM``.
        judge_lm: The judge's LM spec, recorded (default: the LM's model name).
        mode, reasoning: See :class:`~hcqr_dspy.judge.dur_judge.DURJudge`.
        path: The labelled set; default :func:`default_labelled_set`.
        progress: Progress bar.

    Returns:
        :func:`agreement_record`. Nothing is cached here; DSPy's response cache makes a repeated judging of
        the same set by the same judge (another run folder, a stopped judging run again) cost no LM call.

    Raises:
        DataError: see :func:`load_labelled_set`. LMUnavailableError: the judge LM stopped answering.
    """
    path = Path(path) if path is not None else default_labelled_set()
    items = load_labelled_set(path)
    settings = {"judge_lm": judge_lm or getattr(lm, "model", str(lm)), "mode": mode, "reasoning": bool(reasoning)}
    try:
        with dspy.context(lm=lm, adapter=HCQRAdapter()):
            judged = judge_labelled_set(items, DURJudge(mode, reasoning), progress)
    except LM_UNAVAILABLE as exc:
        raise LMUnavailableError(
            f"the judge LM stopped answering while judging the labelled set {path} ({lm_failure(exc)}); "
            "run the same command again (the calls answered so far are in DSPy's cache)"
        ) from None
    return agreement_record(path, items, judged, settings)


def agreement_summary(record: dict[str, Any]) -> dict[str, Any]:
    """The figures of an agreement record, without its per-context ``items`` and ``confusion`` (what
    ``hcqr judge`` prints)."""
    return {k: v for k, v in record.items() if k not in ("items", "confusion")}


def agreement_flags(record: dict[str, Any]) -> list[str]:
    """Why the judge's hand-labelled agreement does not vouch for it: its kappa's 95% interval reaches down to
    ``kappa_low_min`` (chance) or kappa is undefined; ``[]`` for no record or a good one."""
    if not record or not record.get("n"):
        return []
    kappa, ci = record.get("kappa"), record.get("kappa_ci")
    low = ci[0] if ci else kappa
    limit = CONTROL_LIMITS["kappa_low_min"]
    if kappa is None or low is None or low <= limit:
        shown = "undefined" if kappa is None else f"{kappa:.2f}" + (f" [95% CI {ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
        return [
            f"the judge agrees with the hand-labelled contexts no better than chance can explain: Cohen's kappa "
            f"{shown} on {record.get('valid', 0)} valid of {record['n']} (lower bound not above {limit:g})"
        ]
    return []
