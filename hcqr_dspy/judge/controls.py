"""The DUR judge's controls, and when they say a run's DUR cannot be trusted.

With every question's judgment the judge also labels three contexts whose right label is known:

* a *positive control*: a one-document context built to decide the question,
  stating the gold option and why, written from the question's own key terms,
  gold answer and option texts (:func:`positive_control_document`); right label
  ENTAILED or USEFUL;
* a *negative control*: the context another question of the same run retrieved
  (a seeded derangement of the judged questions, preferring one whose context
  does not mention this question's gold option; :func:`negative_control_pairs`);
  right label NOT_USEFUL;
* an *on-topic control*: a context about this question's own topic that cannot
  decide it (:func:`on_topic_contexts`); right label NOT_USEFUL.

Why the on-topic control. The first two are easy: a judge can pass both by
noticing the answer spelled out, or by noticing that the passages are about
another disease. Real retrieved contexts are almost always on the question's
topic, and the judge's hard task is telling a topical context that decides the
question from a topical one that does not. The on-topic control is that second
kind, so a judge that calls topical contexts useful whatever they say fails it.

How it is built (the same for every run over the same questions and index, so
runs are judged against the same control):

1. One distractor option is drawn per question, seeded by the question id
   (:func:`on_topic_option`; only distractors with content words, so that the
   query says something).
2. The run's own retriever (the index the run retrieved from) is searched with
   ``"<distractor text> <question>"`` (distractor first, so an encoder that
   truncates long queries keeps it) for a pool of ``ON_TOPIC_POOL`` times the
   budget: passages about the question's findings and about a wrong answer.
3. Every pooled passage that could carry the gold option's evidence is dropped:
   one that *mentions* the gold option (every stemmed content word of it in the
   passage, the judge-free evidence rule of
   :mod:`hcqr_dspy.evaluation.evidence`); one holding any content word specific
   to the gold option (a stemmed word of the gold option that neither the
   question nor any other option uses: ``burgdorferi``, ``cyproheptadin``,
   ``presynapt``), which catches passages naming the answer in part; and the
   first ``ON_TOPIC_ORACLE_DEPTH`` passages the same retriever returns for
   ``"<gold option text> <question>"`` (what an oracle context would show
   first), which catches deciding passages in other words than the option's
   (a gold option differing from a distractor only by "right" against "left").
4. The first passages left, as many as the row's own shown context holds (the
   same budget as the real context), formatted as the answer step formats
   passages, are the control.

On the shipped demo data (BM25, budget 15) these rules keep none of the 36
relevant passages (``qrels.json``) that, read alone, decide or strongly support
their question, and keep 28 of the 54 passages written about the questions'
distractors, so the control stays on topic. It is built by
rules, not read by a person: a passage deciding the question in words the rules
miss can still slip in. The hand-labelled contexts of
:mod:`hcqr_dspy.judge.agreement` check the judge without relying on rules. A
question whose gold option has no content words (yes/no/maybe) or whose
distractors have none gets no on-topic control (the judgment records why).

A DUR means little if the judge calls everything useful: ``hcqr compare`` flags a DUR whose judge falls outside
:data:`CONTROL_LIMITS` (:func:`control_flags`), and a DUR the judge cannot separate from its on-topic controls.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from hcqr_dspy.evaluation.evidence import content_stems, mentions, option_stems
from hcqr_dspy.judge.dur_metrics import wilson_interval
from hcqr_dspy.programs.context import format_document
from hcqr_dspy.programs.queries import key_terms

# compare flags a DUR whose judge labels more than 20% of negative controls useful, fewer than 80% of positive
# controls, or more than 20% of on-topic controls (a judge outside them cannot tell decision-useful contexts
# apart); and one whose hand-labelled agreement (Cohen's kappa) has a 95% interval reaching down to chance (0).
CONTROL_LIMITS = {"negative_max": 0.20, "positive_min": 0.80, "on_topic_max": 0.20, "kappa_low_min": 0.0}
CONTROL_SEED = 0
# The on-topic control's search depth, as a multiple of the context's budget, before gold-bearing passages go.
ON_TOPIC_POOL = 4
# How many of the passages retrieved with the gold option's text are kept out of the on-topic control.
ON_TOPIC_ORACLE_DEPTH = 3


def positive_control_document(question: str, options: dict[str, str], answer: str) -> str:
    """A one-document context that decides the question: it states the gold option and why.

    Written from the question's own key terms (:func:`~hcqr_dspy.programs.queries.key_terms`),
    its gold answer and its option texts; no knowledge is added, so a judge that
    reads it and still says NOT_USEFUL is not reading the context.
    """
    gold = options[answer]
    others = "; ".join(f"{k}. {v}" for k, v in options.items() if k != answer)
    text = (
        f"In the case described ({key_terms(question, max_words=24)}), the correct answer is {answer}. {gold}. "
        f"The findings described are explained by {gold}, which is therefore the answer; the other options "
        f"({others}) do not explain them and are wrong."
    )
    return format_document(1, gold, text)


def negative_control_pairs(
    rows: list[dict[str, Any]], mentions_gold, seed: int = CONTROL_SEED
) -> dict[str, str | None]:
    """For each judged question, the question of the same run whose context serves as its negative control.

    A seeded derangement (no question gets its own context): questions are
    shuffled with ``seed`` and each takes the context of the next one in that
    order, or, when that context mentions its gold option (``mentions_gold(qid,
    row)`` is true), the first later one that does not (wrapping around; the
    next one if all do).

    Returns:
        ``{qid: donor qid}``; ``None`` for a run with one judged question.
    """
    qids = [r["qid"] for r in rows]
    if len(qids) < 2:
        return {q: None for q in qids}
    order = qids[:]
    random.Random(seed).shuffle(order)
    by_qid = {r["qid"]: r for r in rows}
    out: dict[str, str | None] = {}
    for i, qid in enumerate(order):
        candidates = [order[(i + j) % len(order)] for j in range(1, len(order))]
        out[qid] = next((c for c in candidates if not mentions_gold(qid, by_qid[c])), candidates[0])
    return out


def on_topic_option(qid: str, options: dict[str, str], answer: str, seed: int = CONTROL_SEED) -> str | None:
    """The distractor letter a question's on-topic control is retrieved with: drawn with ``random.Random``
    seeded by ``"<seed>:<qid>"`` among the distractors that have content words; ``None`` when none has."""
    candidates = sorted(k for k, text in options.items() if k != answer and option_stems(text))
    return random.Random(f"{seed}:{qid}").choice(candidates) if candidates else None


def gold_specific_stems(question: str, options: dict[str, str], answer: str) -> frozenset[str]:
    """The stemmed content words of the gold option that neither the question nor another option uses."""
    others = [option_stems(text) for k, text in options.items() if k != answer]
    return option_stems(options[answer]) - content_stems(question) - frozenset().union(*others)


def on_topic_contexts(
    retriever: Any, questions: Sequence[tuple[str, Any, int]], seed: int = CONTROL_SEED
) -> dict[str, dict[str, Any]]:
    """Each question's on-topic control (see the module docstring), with two batched searches in all.

    Args:
        retriever: The run's retriever (``search(queries, k)`` and ``get(passage_id)``).
        questions: ``(qid, question, budget)``: the question (``question``, ``options``, ``answer``) and how
            many passages its real context showed.
        seed: Seeds the distractor drawn per question.

    Returns:
        ``{qid: {"option": letter or None, "passages": [passage ids], "documents": [formatted documents],
        "error": None or why no control could be built}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    wanted = []
    for qid, q, budget in questions:
        option = on_topic_option(qid, q.options, q.answer, seed)
        error = None
        if not option_stems(q.options[q.answer]):
            error = "the gold option has no content words: passages holding its evidence cannot be told apart"
        elif option is None:
            error = "no distractor option has content words to search with"
        out[qid] = {"option": option, "passages": [], "documents": [], "error": error}
        if error is None:
            wanted.append((qid, q, max(1, int(budget))))
    if not wanted:
        return out
    pool = ON_TOPIC_POOL * max(b for _, _, b in wanted)
    hits = retriever.search([f"{q.options[out[qid]['option']]} {q.question}" for qid, q, _ in wanted], pool)
    oracle = retriever.search([f"{q.options[q.answer]} {q.question}" for _, q, _ in wanted], ON_TOPIC_ORACLE_DEPTH)
    for (qid, q, budget), found, shown_first in zip(wanted, hits, oracle):
        gold = q.options[q.answer]
        specific = gold_specific_stems(q.question, q.options, q.answer)
        excluded = {h.passage_id for h in shown_first}
        kept = []
        for hit in found:
            if hit.passage_id in excluded:
                continue
            passage = retriever.get(hit.passage_id)
            if mentions(gold, [passage.text]) or specific & content_stems(passage.text):
                continue
            kept.append(passage)
            if len(kept) == budget:
                break
        out[qid]["passages"] = [p.id for p in kept]
        out[qid]["documents"] = [format_document(i, p.title, p.content) for i, p in enumerate(kept, start=1)]
        if not kept:
            out[qid]["error"] = "every passage retrieved with the distractor could carry the gold option's evidence"
    return out


def control_flags(dur: dict[str, Any]) -> list[str]:
    """Why a run's DUR cannot be trusted, from its control rates (:data:`CONTROL_LIMITS`); ``[]`` if none.

    Flagged: more than ``negative_max`` of negative or ``on_topic_max`` of on-topic controls called useful,
    fewer than ``positive_min`` of positive controls; a DUR at or below the upper end of the 95% Wilson interval
    of the judge's useful-rate on on-topic controls (the judge cannot separate the real contexts from contexts
    built not to decide); a judged run without control judgments; and one whose judgments hold no on-topic
    control (unchecked on it).
    """
    if not dur.get("dur_n"):
        return []
    flags = []
    neg, pos = dur.get("dur_negative_control"), dur.get("dur_positive_control")
    topic = dur.get("dur_on_topic_control")
    if pos is None and neg is None and topic is None:
        return ["no control judgments (judged without controls): the judge is unchecked"]
    if neg is not None and neg > CONTROL_LIMITS["negative_max"]:
        flags.append(
            f"the judge calls {neg:.0%} of negative controls (another question's context) useful "
            f"(> {CONTROL_LIMITS['negative_max']:.0%})"
        )
    if pos is not None and pos < CONTROL_LIMITS["positive_min"]:
        flags.append(
            f"the judge calls only {pos:.0%} of positive controls (a context stating the answer) useful "
            f"(< {CONTROL_LIMITS['positive_min']:.0%})"
        )
    if topic is None:
        why = (
            "none could be built for the judged questions"
            if dur.get("dur_on_topic_control_unbuilt")
            else "judged before the on-topic control existed"
        )
        flags.append(
            f"no on-topic control judgments ({why}): the judge is unchecked on on-topic contexts that do not "
            "decide the question"
        )
        return flags
    if topic > CONTROL_LIMITS["on_topic_max"]:
        flags.append(
            f"the judge calls {topic:.0%} of on-topic controls (the question's topic, not its answer) useful "
            f"(> {CONTROL_LIMITS['on_topic_max']:.0%})"
        )
    n = int(dur.get("dur_on_topic_control_n") or 0)
    if dur.get("dur") is not None and n:
        lo, hi = wilson_interval(round(topic * n), n)
        if dur["dur"] <= hi:
            flags.append(
                f"the judge cannot separate the real contexts from on-topic controls: DUR {dur['dur']:.0%} is "
                f"within reach of its useful-rate on on-topic controls, {topic:.0%} [95% CI {lo:.0%}-{hi:.0%}], "
                f"n={n}"
            )
    return flags
