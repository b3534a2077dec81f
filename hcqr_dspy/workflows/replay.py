"""``hcqr replay``: search run folders' recorded queries again with another index, no LM call.

For each question of a query-planning run (rows that record ``queries``), the recorded queries go to another
index (BM25, dense, hybrid, any backend :func:`~hcqr_dspy.retrieval.load_index` opens) through the run's own
method, rebuilt from its ``config.json`` (:func:`~hcqr_dspy.programs.method_registry.make_program`): the same
passages per query, fusion (:mod:`hcqr_dspy.retrieval.fusion`, called by the program), budget, HCQR's search
of collapsed queries (:meth:`~hcqr_dspy.programs.hcqr.HCQR.retrieve_and_fuse`), and the answer step's context
cut (:meth:`~hcqr_dspy.programs.program_base.MCQProgram.build_context`) to the run's ``max_context_tokens`` counted
without the run's LM (about 4 characters a token, :func:`hcqr_dspy.lm.count_tokens`). A row built from one
query (Simple RAG, HyDE, HCQR's question-alone fallback) or another number of queries than roles searches
``ceil(budget / queries)`` passages per query, as those paths do. No LM is asked anything.

Recorded and replayed contexts are then measured side by side: gold-option coverage (the judge-free evidence
measure, :func:`hcqr_dspy.evaluation.evidence.question_evidence`, over the documents as the answer step sees
them) with an exact McNemar test between the two, distinct and shared passages, and the queries' diversity
(:mod:`hcqr_dspy.reporting.query_diversity`). The replay index must hold the run's corpus (same corpus
fingerprint as the run recorded; for a run that recorded none, every shown passage must be in it): the
recorded contexts are read from it too. Methods that choose passages after searching with a reranker or an
LM judge (``rerank_rag``, ``main_rag``) are refused: their queries alone do not rebuild their contexts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError, RetrievalIndexError, RunError
from hcqr_dspy.evaluation.evidence import evidence_summary, paired_evidence_tests, question_evidence
from hcqr_dspy.evaluation.folders import out_folder_fault, repeated_folder
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.programs.context import passage_records, shown_documents
from hcqr_dspy.programs.hypothesis import query_names
from hcqr_dspy.programs.method_registry import PROGRAMS
from hcqr_dspy.programs.program_base import MCQProgram
from hcqr_dspy.reporting.query_diversity import (
    NEAR_DUPLICATE_JACCARD,
    distinct_passages,
    diversity_summary,
    has_queries,
    replay_markdown,
)
from hcqr_dspy.reporting.runs import Run, load_run, unique_labels
from hcqr_dspy.retrieval import load_index
from hcqr_dspy.retrieval.retriever_base import Retriever, read_manifest
from hcqr_dspy.workflows.programs import run_program

# Methods whose context is not their queries' fused hits: what chooses their passages after the search.
NOT_REPLAYABLE = {"rerank_rag": "a cross-encoder", "main_rag": "an LM judge"}
REPORT = "replay.md"
SUMMARY = "replay.json"


def replay_faults(
    run_dirs: Sequence[str | Path], index: str | Path, out_dir: str | Path | None = None
) -> list[HCQRError]:
    """Every reason the replay of ``run_dirs`` against ``index`` cannot run, one error per fault, before
    anything is loaded or written (``hcqr replay`` prints one line each).

    Faults: no run folder given, a folder given twice, a missing or unreadable run folder, a run without a
    finished question or without recorded queries (CoT: nothing to replay), a method refused by
    :data:`NOT_REPLAYABLE`, a dataset that does not load, a missing or broken index, an index over another
    corpus than the run's (corpus fingerprints differ), an ``out_dir`` that is a file, a run folder or an index folder.
    """
    faults: list[HCQRError] = []
    if not run_dirs:
        faults.append(RunError("replay needs at least one run folder"))
    manifest = None
    try:
        manifest = read_manifest(index, verify_files=False)
    except HCQRError as exc:
        faults.append(exc)
    seen: dict[Path, str] = {}
    for path in run_dirs:
        twice = repeated_folder(path, seen)
        if twice:
            faults.append(RunError(twice))
            continue
        try:
            _check_run(RunFolder.open(path), manifest, index)
        except HCQRError as exc:
            faults.append(exc)
    if out_dir is not None:
        fault = out_folder_fault(Path(out_dir), "replay")
        if fault:
            faults.append(HCQRError(fault))
    return faults


def _check_run(folder: RunFolder, manifest: dict[str, Any] | None, index: str | Path) -> None:
    """Raise the first fault of one run folder (see :func:`replay_faults`)."""
    rows = folder.rows()
    if not rows:
        raise RunError(f"{folder.path} has no finished question: nothing to replay")
    if not has_queries(rows):
        raise RunError(f"{folder.path}: method {folder.method} records no search queries: nothing to replay")
    if folder.method in NOT_REPLAYABLE:
        raise RunError(
            f"{folder.path}: method {folder.method} chooses its passages with {NOT_REPLAYABLE[folder.method]} "
            "after searching: its queries alone do not rebuild its contexts"
        )
    if folder.method not in PROGRAMS:
        raise RunError(f"{folder.path}: unknown method {folder.method!r}; choose one of {', '.join(PROGRAMS)}")
    if manifest is not None:
        recorded = folder.config.get("index") or {}
        want, have = recorded.get("corpus_fingerprint"), manifest["corpus"]["fingerprint"]
        if want and have != want:
            raise RetrievalIndexError(
                f"index {index} holds another corpus (fingerprint {have[:12]}, {manifest['corpus']['count']} "
                f"passages) than run {folder.path} retrieved from ({want[:12]}, {recorded.get('corpus_count', '?')} "
                f"passages of {recorded.get('corpus_source', '?')}); replay needs an index over the run's corpus"
            )
    folder.load_questions()  # the options and gold answers, from the run's dataset


def replay_row(program: MCQProgram, row: dict[str, Any], question: str, options: dict[str, str]) -> list[dict]:
    """One row's recorded queries searched again by ``program``: the passage records of the context its answer
    step would see (:func:`~hcqr_dspy.programs.context.passage_records`: ``id``, ``title``, ``score``,
    ``queries``, ``ranks``, ``shown_chars`` for a cut one), at most the program's budget."""
    queries = list(row["queries"])
    roles = row.get("query_roles") or []
    retrieve_and_fuse = getattr(program, "retrieve_and_fuse", None)
    if retrieve_and_fuse is not None and roles and len(roles) == len(queries):
        fused, _ = retrieve_and_fuse(queries, query_names(roles))
    else:
        k = math.ceil(program.budget / len(queries))
        fused = program.fuse(
            program.retrieve(queries, k=k), budget=program.budget, strategy=getattr(program, "fusion", "score_sum")
        )
    _, cut, partial = program.build_context([f.passage_id for f in fused], program.context_budget(question, options))
    return passage_records(program.retriever, fused, partial)[: cut["passages_kept"]]


def _missing_passages(retriever: Retriever, run: Run, index: str | Path) -> None:
    """Refuse an index that lacks passages the run showed (a run that recorded no corpus fingerprint)."""
    missing = []
    for row in run.rows:
        for p in row.get("passages") or []:
            try:
                retriever.get(p["id"])
            except KeyError:
                missing.append(p["id"])
    if missing:
        raise RetrievalIndexError(
            f"index {index} lacks {len(missing)} passage(s) run {run.path} showed (e.g. {missing[0]!r}): it holds "
            "another corpus; replay needs an index over the run's corpus"
        )


def replay_run(
    run: Run, retriever: Retriever, index: str | Path, budget: int | None, threshold: float
) -> dict[str, Any]:
    """Replay one loaded run (see the module docstring).

    Returns:
        ``path``, ``method``, ``recorded_index`` (the run's index kind and folder name), ``budget`` (the
        replay's), ``run_budget``, ``fusion``, ``queries``
        (:func:`~hcqr_dspy.reporting.query_diversity.diversity_summary`),
        ``recorded`` and ``replayed`` (``evidence_n``, ``gold_coverage`` ... of
        :func:`~hcqr_dspy.evaluation.evidence.evidence_summary`, and ``distinct_passages``: mean per context),
        ``coverage_test`` (:func:`~hcqr_dspy.evaluation.evidence.paired_evidence_tests`, recorded as the
        reference; ``None`` when no question is measurable), ``shared_passages`` (mean per question) and
        ``per_question`` (``qid``, ``queries``, ``recorded`` / ``replayed`` passage ids, ``recorded_gold`` /
        ``replayed_gold``: gold option mentioned, ``None`` when it has no content word).
    """
    import dspy

    _missing_passages(retriever, run, index)
    folder = run.folder
    questions = folder.load_questions()
    program = run_program(folder, retriever, budget)
    rows = [r for r in run.rows if r.get("queries")]
    recorded_ev: dict[str, dict | None] = {}
    replayed_ev: dict[str, dict | None] = {}
    per_question = []
    with dspy.context(lm=None):  # no LM: the context's tokens are estimated from its characters
        for row in rows:
            q = questions[row["qid"]]
            shown = replay_row(program, row, q.question, q.options)
            recorded = row.get("passages") or []
            recorded_ev[row["qid"]] = question_evidence(q.options, q.answer, shown_documents(retriever, recorded))
            replayed_ev[row["qid"]] = question_evidence(q.options, q.answer, shown_documents(retriever, shown))
            per_question.append(
                {
                    "qid": row["qid"],
                    "queries": row["queries"],
                    "recorded": [p["id"] for p in recorded],
                    "replayed": [p["id"] for p in shown],
                    "recorded_gold": (recorded_ev[row["qid"]] or {}).get("gold_mentioned"),
                    "replayed_gold": (replayed_ev[row["qid"]] or {}).get("gold_mentioned"),
                }
            )
    n = len(per_question)

    def side(name: str, evidence: dict[str, dict | None]) -> dict[str, Any]:
        return {
            **evidence_summary({"evidence": e} for e in evidence.values()),
            "distinct_passages": sum(distinct_passages(p[name]) for p in per_question) / n,
        }

    recorded_index = folder.config.get("index") or {}
    return {
        "path": str(run.path.resolve()),
        "method": folder.method,
        "recorded_index": f"{recorded_index.get('retriever', '?')} `{Path(recorded_index.get('path') or '?').name}`",
        "budget": program.budget,
        "run_budget": (folder.config.get("program") or {}).get("budget"),
        "fusion": getattr(program, "fusion", "score_sum"),
        "queries": diversity_summary(rows, threshold),
        "recorded": side("recorded", recorded_ev),
        "replayed": side("replayed", replayed_ev),
        "coverage_test": paired_evidence_tests(recorded_ev, replayed_ev),
        "shared_passages": sum(len(set(p["recorded"]) & set(p["replayed"])) for p in per_question) / n,
        "per_question": per_question,
    }


def replay(
    run_dirs: Sequence[str | Path],
    index: str | Path,
    out_dir: str | Path | None = None,
    budget: int | None = None,
    threshold: float = NEAR_DUPLICATE_JACCARD,
    retriever: Retriever | None = None,
) -> tuple[str, dict[str, Any], list[Path]]:
    """Replay each run's recorded queries against ``index`` and report recorded vs replayed contexts.

    Args:
        run_dirs: Run folders of query-planning methods (``hcqr eval``), over the index's corpus.
        index: The index folder to search (any kind :func:`~hcqr_dspy.retrieval.load_index` opens).
        out_dir: Write ``replay.md`` and ``replay.json`` there; ``None`` writes nothing.
        budget: Passages per context instead of each run's own budget.
        threshold: Jaccard threshold of near-duplicate queries
            (:data:`~hcqr_dspy.reporting.query_diversity.NEAR_DUPLICATE_JACCARD`).
        retriever: ``index`` already loaded (tests, notebooks).

    Returns:
        The Markdown report, the summary (``index``: ``path``, ``retriever``, ``count``, ``corpus_fingerprint``;
        ``near_duplicate_jaccard``; ``runs``: ``{label: replay_run(...)}``, labels as ``hcqr compare`` gives
        them) and the files written.

    Raises:
        HCQRError: any fault of :func:`replay_faults` (the only one, or all of them in one message), or an index
            that lacks the passages of a run that recorded no corpus fingerprint.
    """
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise HCQRError(f"budget must be a positive integer, got {budget!r}")
    faults = replay_faults(run_dirs, index, out_dir)
    if len(faults) == 1:
        raise faults[0]
    if faults:
        raise RunError("; ".join(str(f) for f in faults))
    manifest = read_manifest(index, verify_files=False)
    retriever = retriever if retriever is not None else load_index(index)
    runs = [load_run(p) for p in run_dirs]
    unique_labels(runs)
    summary = {
        "index": {
            "path": str(index),
            "retriever": manifest["retriever"],
            "count": manifest["corpus"]["count"],
            "corpus_fingerprint": manifest["corpus"]["fingerprint"],
        },
        "near_duplicate_jaccard": threshold,
        "runs": {r.label: replay_run(r, retriever, index, budget, threshold) for r in runs},
    }
    report = replay_markdown(summary)
    files: list[Path] = []
    if out_dir is not None:
        out = Path(out_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / REPORT).write_text(report, encoding="utf-8")
            (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise HCQRError(f"cannot write the replay into --out {out}: {exc.strerror or exc}") from None
        files = [out / REPORT, out / SUMMARY]
    return report, summary, files
