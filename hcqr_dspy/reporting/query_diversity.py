"""Query diversity of query-planning runs, and the tables of ``hcqr replay``: pure functions over run rows.

A *query-planning run* is one whose rows record the search queries its method sent (``queries``: HCQR's
three, a rewriter's, HyDE's passage, Simple RAG's question); CoT and the hypothesis alone record none.
Per question, over the row's recorded queries and shown context (``passages``, after the token budget):

* **Near-duplicate query pairs**: pairs ``i < j`` of the question's queries whose term sets have a
  Jaccard coefficient ``|A ∩ B| / |A ∪ B| >= NEAR_DUPLICATE_JACCARD`` (0.6). A query's term set is its
  stemmed content words as the judge-free evidence measure reads text
  (:func:`hcqr_dspy.evaluation.evidence.content_stems`: lower-cased word tokens, one-letter tokens and bm25s'
  ``STOPWORDS_EN_PLUS`` dropped, Snowball-stemmed), so "urine collection" and "the collection of urine"
  are the same query; two queries without content words count as a pair (equal empty sets). The
  coefficient is Jaccard's (1912, "The distribution of the flora in the alpine zone", New Phytologist), the
  "resemblance" Broder (1997, "On the resemblance and containment of documents") measures near-duplicate
  documents with. The threshold 0.6 is this project's choice (at least three fifths of the two queries'
  terms shared), a parameter of every function here; on the committed MMLU-Med study it gives 44 of the
  100 HCQR rows with a near-duplicate pair.
* **Distinct passages per context**: distinct passage ids among the shown passages (fusion keeps each
  passage once, so this is how far overlapping queries left the context short of the budget).
* **Query length**: words (whitespace-separated tokens) per query, averaged over every query of the run.

Per run (:func:`diversity_summary`): means over the questions that have queries. :func:`query_diversity_section`
is the section ``hcqr compare`` shows; :func:`replay_markdown` renders the summary of
:func:`hcqr_dspy.workflows.replay.replay`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import combinations
from typing import Any

from hcqr_dspy.evaluation.evidence import content_stems

NEAR_DUPLICATE_JACCARD = 0.6

QUERY_DIVERSITY_NOTE = (
    "Over each run's questions with recorded queries: near-duplicate pairs = pairs of a question's queries "
    f"whose stemmed content-word sets have Jaccard >= {NEAR_DUPLICATE_JACCARD} (per question, and the share of "
    "questions with at least one); distinct passages = distinct passages in the shown context (of the budget); "
    "words per query = mean over every query."
)


def query_terms(query: str) -> frozenset[str]:
    """A query's term set: its stemmed content words (:func:`hcqr_dspy.evaluation.evidence.content_stems`)."""
    return content_stems(query)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """``|a ∩ b| / |a ∪ b|``; 1.0 for two empty sets (they are equal)."""
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def near_duplicate_pairs(queries: Sequence[str], threshold: float = NEAR_DUPLICATE_JACCARD) -> int:
    """Pairs ``i < j`` of ``queries`` whose term sets (:func:`query_terms`) have Jaccard ``>= threshold``."""
    terms = [query_terms(q) for q in queries]
    return sum(jaccard(a, b) >= threshold for a, b in combinations(terms, 2))


def query_words(query: str) -> int:
    """Words (whitespace-separated tokens) of a query."""
    return len(query.split())


def distinct_passages(passages: Iterable[dict[str, Any] | str]) -> int:
    """Distinct passage ids of a context: passage records (``{"id": ...}``, as rows hold them) or ids."""
    return len({p["id"] if isinstance(p, dict) else p for p in passages})


def has_queries(rows: Iterable[dict[str, Any]]) -> bool:
    """Whether any row records search queries (a query-planning run)."""
    return any(r.get("queries") for r in rows)


def diversity_summary(
    rows: Iterable[dict[str, Any]], threshold: float = NEAR_DUPLICATE_JACCARD
) -> dict[str, float | int] | None:
    """Query diversity of a run's rows that record queries (the module docstring defines each measure).

    Returns:
        ``questions`` (rows with queries), ``queries_per_question``, ``near_duplicate_pairs`` (mean pairs
        per question), ``with_near_duplicate`` (share of questions with at least one pair),
        ``distinct_passages`` (mean per shown context) and ``words_per_query`` (mean over every query);
        ``None`` when no row records queries.
    """
    planned = [r for r in rows if r.get("queries")]
    if not planned:
        return None
    n = len(planned)
    pairs = [near_duplicate_pairs(r["queries"], threshold) for r in planned]
    queries = [q for r in planned for q in r["queries"]]
    return {
        "questions": n,
        "queries_per_question": len(queries) / n,
        "near_duplicate_pairs": sum(pairs) / n,
        "with_near_duplicate": sum(p > 0 for p in pairs) / n,
        "distinct_passages": sum(distinct_passages(r.get("passages") or []) for r in planned) / n,
        "words_per_query": sum(query_words(q) for q in queries) / len(queries),
    }


def _budget(config: dict[str, Any]) -> str:
    budget = (config.get("program") or {}).get("budget")
    return f" of {budget}" if budget else ""


def query_diversity_section(runs: Sequence[Any]) -> tuple[str, dict[str, Any]]:
    """The ``hcqr compare`` section: one row per query-planning run (:func:`has_queries`); none for CoT.

    Args:
        runs: Loaded runs (:class:`~hcqr_dspy.reporting.runs.Run`: ``label``, ``rows``, ``config``).

    Returns:
        ``(markdown table, {label: diversity_summary})``; ``("", {})`` when no run records queries.
    """
    figures = {r.label: s for r in runs if (s := diversity_summary(r.rows)) is not None}
    if not figures:
        return "", {}
    lines = [
        "| run | questions | queries / question | near-duplicate pairs / question | questions with one | "
        "distinct passages / context | words / query |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        if (s := figures.get(run.label)) is None:
            continue
        lines.append(
            f"| {run.label} | {s['questions']} | {s['queries_per_question']:.2f} | {s['near_duplicate_pairs']:.2f} | "
            f"{s['with_near_duplicate']:.1%} | {s['distinct_passages']:.1f}{_budget(run.config)} | "
            f"{s['words_per_query']:.1f} |"
        )
    return "\n".join(lines), figures


def _coverage(side: dict[str, Any]) -> str:
    return f"{side['gold_coverage']:.1%} ({side['evidence_n']})" if side.get("evidence_n") else "–"


def replay_markdown(summary: dict[str, Any]) -> str:
    """``replay.md``: the query table and the recorded-vs-replayed context table of a replay summary
    (:func:`hcqr_dspy.workflows.replay.replay`'s ``runs``, ``index``, ``near_duplicate_jaccard``)."""
    index = summary["index"]
    runs = summary["runs"]
    head = (
        f"# Query replay against `{index['path']}` ({index['retriever']}, {index['count']} passages)\n\n"
        "Each run's recorded queries searched again with this index, with the run's fusion and budget; "
        "no LM call. Recorded = the context the run's answer step saw; replayed = the context the same "
        "queries get from this index (cut to the run's context token budget, about 4 characters a token)."
    )
    queries = [
        "| run | questions | queries / question | near-duplicate pairs / question | questions with one | "
        "words / query |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    contexts = [
        "| run | recorded index | budget | fusion | gold coverage: recorded | replayed | b/c | McNemar p | "
        "distinct passages: recorded | replayed | shared passages |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in runs.items():
        q = r["queries"]
        queries.append(
            f"| {label} | {q['questions']} | {q['queries_per_question']:.2f} | {q['near_duplicate_pairs']:.2f} | "
            f"{q['with_near_duplicate']:.1%} | {q['words_per_query']:.1f} |"
        )
        t = r.get("coverage_test")
        test = [f"{t['gold_b']}/{t['gold_c']}", f"{t['gold_p']:.3g}"] if t else ["–", "–"]
        budget = f"{r['budget']}" + (f" (run: {r['run_budget']})" if r["run_budget"] not in (None, r["budget"]) else "")
        contexts.append(
            f"| {label} | {r['recorded_index']} | {budget} | {r['fusion']} | {_coverage(r['recorded'])} | "
            f"{_coverage(r['replayed'])} | {' | '.join(test)} | {r['recorded']['distinct_passages']:.1f} | "
            f"{r['replayed']['distinct_passages']:.1f} | {r['shared_passages']:.1f} |"
        )
    notes = (
        "Gold coverage = share of the questions with a measurable gold option (their number in brackets) "
        "whose context has one passage holding every stemmed content word of the gold option (the judge-free "
        "evidence measure of `hcqr compare`); b = questions whose recorded context mentions the gold option "
        "and the replayed one not, c = the reverse, exact McNemar test. Shared passages = passages in both "
        "contexts, per question. Near-duplicate pairs: queries of a question whose stemmed content-word sets "
        f"have Jaccard >= {summary['near_duplicate_jaccard']}."
    )
    return (
        "\n\n".join([head, "## Queries\n\n" + "\n".join(queries), "## Contexts\n\n" + "\n".join(contexts), notes])
        + "\n"
    )
