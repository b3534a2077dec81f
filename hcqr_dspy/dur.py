"""Decision-Useful Rate (DUR): an LM judge labels each question's retrieved context, with controls.

Labels (HCQR paper): ``ENTAILED`` — the context alone implies the gold
answer; ``USEFUL`` — strong support for the gold answer that needs a small
inference; ``NOT_USEFUL`` — otherwise. DUR = share of judged questions
labelled ENTAILED or USEFUL. A judge reply outside the three labels is an
*invalid judgment*: counted separately, never mapped to a label.

The judge sees exactly the context the answer step saw: the row's shown
passages (after the token budget; a cut passage cut where it was cut,
:func:`hcqr_dspy.programs.base.shown_documents`), never the passages fusion
kept but the budget dropped.

Judge controls (a DUR means little if the judge calls everything useful):
with every question's judgment the judge also labels

* a *positive control*: a one-document context built to decide the question,
  stating the gold option and why, written from the question's own key terms,
  gold answer and option texts (:func:`positive_control_document`);
* a *negative control*: the context another question of the same run retrieved
  (a seeded derangement of the judged questions, preferring one whose context
  does not mention this question's gold option; :func:`negative_control_pairs`).

The report gives the judge's useful-rate on both beside the DUR, and
``hcqr compare`` flags a DUR whose judge calls more than 20% of negative
controls useful or fewer than 80% of positive controls (:data:`CONTROL_LIMITS`).
By default the judge reasons before it labels (``dspy.ChainOfThought``); this
and the judge LM and mode are recorded in every judgment and in ``dur.json``,
and a resumed judging with other settings is refused.

Two modes: ``context`` (one judgment over the shown context, as in the
paper) and ``passage`` (each passage judged alone, for finer attribution;
the context label is the best passage label). For HCQR runs, the role shares
say in how many decision-useful contexts a passage found by q1 (support), q2
(distinction) and q3 (key features) was present.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Literal

import dspy

from hcqr_dspy.data import format_options, select
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluate import LM_UNAVAILABLE
from hcqr_dspy.lm import call_retrying_bad_replies
from hcqr_dspy.programs.base import BAD_REPLY_ERRORS, format_document, key_terms, shown_documents, stage
from hcqr_dspy.retrieval.base import Retriever
from hcqr_dspy.run_folder import DUR_METRICS, ProgramError, RunError, RunFolder, WriterLock, lm_failure
from hcqr_dspy.signatures import JudgeContext, JudgePassage

LABELS = ("ENTAILED", "USEFUL", "NOT_USEFUL")
USEFUL_LABELS = {"ENTAILED", "USEFUL"}
ROLE_NAMES = ("q1", "q2", "q3")
# compare flags a DUR whose judge labels more than 20% of negative controls useful or fewer than 80% of
# positive controls (issue 15's bars; a judge outside them cannot tell decision-useful contexts apart).
CONTROL_LIMITS = {"negative_max": 0.20, "positive_min": 0.80}
JUDGE_MAX_TOKENS = 512
CONTROL_SEED = 0


def correct_answer_text(options: dict[str, str], answer: str) -> str:
    return f"{answer}. {options[answer]}"


def positive_control_document(question: str, options: dict[str, str], answer: str) -> str:
    """A one-document context that decides the question: it states the gold option and why.

    Written from the question's own key terms (:func:`~hcqr_dspy.programs.base.key_terms`),
    its gold answer and its option texts; no knowledge is added, so a judge that
    reads it and still says NOT_USEFUL is not reading the context.
    """
    gold = options[answer]
    others = "; ".join(f"{k}. {v}" for k, v in options.items() if k != answer)
    text = (f"In the case described ({key_terms(question, max_words=24)}), the correct answer is {answer}. {gold}. "
            f"The findings described are explained by {gold}, which is therefore the answer; the other options "
            f"({others}) do not explain them and are wrong.")
    return format_document(1, gold, text)


def negative_control_pairs(rows: list[dict[str, Any]], mentions_gold, seed: int = CONTROL_SEED) -> dict[str, str | None]:
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


class DURJudge(dspy.Module):
    """Labels a context with the DUR judge.

    Args:
        mode: ``"context"`` (one call per context) or ``"passage"`` (one per passage).
        reasoning: The judge writes its reasoning before the label (``dspy.ChainOfThought``);
            ``False`` asks for the label alone (``dspy.Predict``).
    """

    def __init__(self, mode: Literal["context", "passage"] = "context", reasoning: bool = True):
        super().__init__()
        if mode not in ("context", "passage"):
            raise HCQRError(f"unknown DUR mode {mode!r}; choose context or passage")
        self.mode = mode
        self.reasoning = bool(reasoning)
        module = dspy.ChainOfThought if self.reasoning else dspy.Predict
        self.judge_context = module(JudgeContext)
        self.judge_passage = module(JudgePassage)

    def label_context(self, common: dict[str, str], documents: list[str]) -> tuple[str | None, str | None, str | None]:
        """``(label, rationale, error)`` of one context-mode judgment; a bad reply gives ``(None, None, error)``."""
        try:
            pred = self.judge_context(context="\n".join(documents), **common)
        except BAD_REPLY_ERRORS as exc:
            return None, None, f"{type(exc).__name__}: {exc}"[:300]
        label = pred.label if pred.label in LABELS else None
        return label, pred.get("reasoning"), None if label else f"label {pred.label!r} is not one of {LABELS}"

    def forward(self, question: str, options: dict[str, str], answer: str, documents: list[str],
                negative_documents: list[str] | None = None) -> dspy.Prediction:
        """Judge ``documents`` (formatted as the answer step saw them) and the two controls.

        Returns:
            ``label`` (or ``None`` for a bad reply), ``rationale`` (passage mode: that of the passage
            whose label is the context's), ``error``, ``passage_labels`` and ``passage_rationales``
            (passage mode), ``positive_label`` / ``positive_rationale``, ``negative_label`` /
            ``negative_rationale`` (``None`` when there is no negative control), ``stages``.
        """
        common = dict(question=question, options=format_options(options), correct_answer=correct_answer_text(options, answer))
        stages: dict = {}
        passage_labels = passage_rationales = None
        with stage(stages, "judge"):
            if self.mode == "context":
                label, rationale, error = self.label_context(common, documents)
            else:
                passage_labels, passage_rationales = [], []
                for doc in documents:
                    try:
                        pred = self.judge_passage(passage=doc, **common)
                        lab, why = pred.label, pred.get("reasoning")
                    except BAD_REPLY_ERRORS:
                        lab, why = None, None
                    passage_labels.append(lab if lab in LABELS else None)
                    passage_rationales.append(why if lab in LABELS else None)
                valid = [i for i, lab in enumerate(passage_labels) if lab]
                best = min(valid, key=lambda i: LABELS.index(passage_labels[i])) if valid else None
                label = passage_labels[best] if best is not None else None
                rationale = passage_rationales[best] if best is not None else None
                error = None if valid else "no valid passage judgment"
        with stage(stages, "controls"):
            positive, positive_why, _ = self.label_context(common, [positive_control_document(question, options, answer)])
            negative, negative_why, _ = (self.label_context(common, negative_documents) if negative_documents
                                         else (None, None, None))
        return dspy.Prediction(label=label, rationale=rationale, error=error, passage_labels=passage_labels,
                               passage_rationales=passage_rationales, positive_label=positive,
                               positive_rationale=positive_why, negative_label=negative,
                               negative_rationale=negative_why, stages=stages)


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
    trace_tags: dict[str, str] | None = None,
    limit: int | None = None,
    seed: int = 0,
    ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Judge every question of a finished (or partial) run, or a sample of them, with controls; write
    ``judgments.jsonl`` and ``dur.json``.

    Questions without shown passages (CoT, or nothing retrieved) are not
    judged. Judging resumes: questions already in ``judgments.jsonl`` are
    skipped, if they were judged with the same settings. With a sample
    (:func:`judged_sample`), only its questions the run has answered are
    judged, negative controls come from the sample's own contexts, and
    ``dur.json`` covers the sample and says so under ``sample``.

    Args:
        run: The run folder.
        retriever: Resolves passage ids (the run's index).
        lm: The judge's ``dspy.LM``.
        mode: ``"context"`` or ``"passage"``.
        reasoning: The judge reasons before it labels.
        judge_lm: The judge's LM spec, recorded (default: the LM's model name).
        num_threads: Judgments in flight.
        progress: Progress bar.
        trace_tags: Record each question's judging (the judge's calls and its controls) as an MLflow trace
            named ``dur judge`` with these tags plus ``qid``; its id is kept in the judgment as
            ``judge_trace_id``. ``None``: no traces.
        limit, seed, ids: Judge only these questions (:func:`judged_sample`); default all.

    Returns:
        DUR metrics (see :func:`dur_metrics`) with the judge's settings under ``judge``.

    Raises:
        RunError: no predictions, unreadable dataset, or judgments made with other settings.
        LMUnavailableError: the judge LM stopped answering (judgments so far kept).
        ProgramError: the judging code raised something that is not a bad judge reply.
    """
    from hcqr_dspy.evidence import mentions

    folder = run if isinstance(run, RunFolder) else RunFolder.open(run)
    rows = folder.rows()
    if not rows:
        raise RunError(f"{folder.path} has no finished question; run `hcqr eval` first")
    questions = folder.load_questions()
    unlabelled = [r["qid"] for r in rows if questions[r["qid"]].answer is None]
    if unlabelled:
        raise RunError(f"{folder.path}: {len(unlabelled)} question(s) have no gold answer ({', '.join(unlabelled[:5])}); "
                       "the DUR judge needs the correct answer")
    settings = {"judge_lm": judge_lm or getattr(lm, "model", str(lm)), "mode": mode, "reasoning": bool(reasoning),
                "controls": True, "control_seed": CONTROL_SEED}
    done = folder.judgments()
    other = [j for j in done if {k: j.get(k) for k in settings} != settings]
    if other:
        old = {k: other[0].get(k) for k in settings}
        raise RunError(f"{folder.judgments_table.path} holds judgments made with other settings ({old}); "
                       f"these would be {settings}; delete it (and dur.json) to judge again")
    judge = DURJudge(mode, reasoning)
    sample = judged_sample(folder, limit=limit, seed=seed, ids=ids)
    chosen = None if sample is None else set(sample["ids"])
    todo = [r for r in rows if r.get("passages") and (chosen is None or r["qid"] in chosen)]
    if sample is not None and not todo:
        raise RunError(f"{folder.path}: none of the {len(chosen)} questions chosen to judge has been answered "
                       "with a context yet")

    def gold_in(qid: str, row: dict[str, Any]) -> bool:
        q = questions[qid]
        return mentions(q.options[q.answer], [retriever.get(p["id"]).text for p in row["passages"]])

    donors = negative_control_pairs(todo, gold_in)
    by_qid = {r["qid"]: r for r in todo}

    def judged(row: dict[str, Any]) -> dict[str, Any]:
        if trace_tags is None:
            return work(row)
        from hcqr_dspy import traces

        q = questions[row["qid"]]
        with traces.question("dur judge", q.question, q.options, {**trace_tags, "qid": row["qid"]}) as trace:
            record = work(row)
            trace.root.set_outputs({k: record[k] for k in ("label", "rationale", "positive_label", "negative_label")})
            record["judge_trace_id"] = trace.trace_id
        return record

    def work(row: dict[str, Any]) -> dict[str, Any]:
        q = questions[row["qid"]]
        donor = donors.get(row["qid"])
        def attempt():
            return judge(question=q.question, options=q.options, answer=q.answer,
                         documents=shown_documents(retriever, row["passages"]),
                         negative_documents=shown_documents(retriever, by_qid[donor]["passages"]) if donor else None)

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
            "stages": pred.stages,
            "seconds": round(time.perf_counter() - t0, 4),
        }

    def bug(row: dict[str, Any], exc: BaseException) -> ProgramError:
        tb = folder.save_traceback(f"judge-{row['qid']}", exc)
        return ProgramError(f"judging question {row['qid']!r} raised {lm_failure(exc)} (traceback in {tb}); "
                            "fix it and run the same command again to resume", row["qid"], tb)

    if {r["qid"] for r in todo} - {j["qid"] for j in done}:
        folder.record_session("judge", lm)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        judgments, _, _ = folder.judgments_table.map(todo, lambda r: r["qid"], judged, LM_UNAVAILABLE, num_threads,
                                                     progress, on_error=bug)
    metrics = {**dur_metrics(judgments), "judge": settings}
    if sample is not None:
        metrics["sample"] = {**sample, "n": len(sample["ids"]), "answered_with_context": len(todo),
                             "run_answered_with_context": sum(bool(r.get("passages")) for r in rows)}
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
    from hcqr_dspy.retrieval.base import read_manifest

    path = index or folder.index_path
    if not path:
        raise RunError(f"{folder.path}: the run records no index; give --index")
    want = (folder.config.get("index") or {}).get("corpus_fingerprint")
    have = read_manifest(path, verify_files=False)["corpus"]["fingerprint"]
    if want and have != want:
        raise RunError(f"index {path} was built from another corpus (fingerprint {have[:12]}) than run {folder.path} "
                       f"retrieved from ({want[:12]}); give the --index it was run with")
    return path


def judge_and_track(
    run: str | Path | RunFolder,
    judge_lm: str | None = None,
    lm: Any = None,
    mode: Literal["context", "passage"] = "context",
    reasoning: bool = True,
    index: str | Path | None = None,
    retriever: Retriever | None = None,
    mlflow_dir: str | Path | None = None,
    track: bool = True,
    num_threads: int = 1,
    progress: bool = True,
    max_tokens: int = JUDGE_MAX_TOKENS,
    n_ctx: int | None = None,
    api_base: str | None = None,
    api_key_env: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    ids: Sequence[str] | None = None,
) -> dict[str, Any] | None:
    """Judge one run and record the result in its MLflow run: the one judging path of
    ``hcqr judge`` and of experiments.

    Args:
        run: The run folder.
        judge_lm: The judge's LM spec; default the run's own LM.
        lm: A ready judge ``dspy.LM`` (tests, notebooks, experiments sharing one); ``judge_lm``
            is still what is recorded.
        mode, reasoning: See :class:`DURJudge`.
        index: The index to resolve passages; default the run's own.
        retriever: A loaded retriever instead of ``index``.
        mlflow_dir: MLflow store; the run's MLflow run (if any) gets the DUR metrics, the
            judge's settings as tags (``dur.judge_lm`` ...) and the updated record files; the judge's calls are traced
            (one ``dur judge`` trace per question, tagged ``kind=dur_judge``, ``qid`` and the judged run),
            and each label is logged on the question's trace (:func:`log_dur_feedback`).
        track: Log to MLflow.
        num_threads, progress: See :func:`judge_run`.
        max_tokens, n_ctx, api_base, api_key_env: Settings of the judge LM when it is built here.
        limit, seed, ids: Judge only these questions (:func:`judged_sample`); default all.

    Returns:
        The DUR metrics, or ``None`` for a run without retrieval (nothing to judge; said on stderr).

    Raises:
        HCQRError: not a run folder, an unusable judge LM or index, or any error of :func:`judge_run`.
    """
    from hcqr_dspy.retrieval import load_index

    folder = run if isinstance(run, RunFolder) else RunFolder.open(run)
    if not judgeable(folder):
        print(f"{folder.path}: no question has a retrieved context (method {folder.method}): nothing to judge",
              file=sys.stderr)
        return None
    with WriterLock(folder.path, "judge"):  # one writer: a second judge (or an eval) of the folder is refused
        if retriever is None:
            retriever = load_index(check_judge_index(folder, index))
        lm, spec = _judge_lm(folder, judge_lm, lm, max_tokens, n_ctx, api_base, api_key_env)
        return _judge_and_track(folder, retriever, lm, spec, mode, reasoning, mlflow_dir, track, num_threads, progress,
                                limit, seed, ids)


def _judge_lm(folder: RunFolder, judge_lm: str | None, lm: Any, max_tokens: int, n_ctx: int | None,
              api_base: str | None, api_key_env: str | None) -> tuple[Any, str | None]:
    """The judge's ``dspy.LM`` and spec: ``judge_lm``, or the run's own LM at the run's own endpoint (its
    ``api_base`` and key variable, unless given), never a provider's default endpoint in its place. The endpoint
    is said on stderr before the LM is asked anything.

    Raises:
        RunError: no judge LM given and the run records none. LMSpecError: see :func:`hcqr_dspy.lm.build_lm`,
            :func:`hcqr_dspy.lm.check_lm`.
    """
    from hcqr_dspy.lm import DEFAULT_N_CTX, build_lm, check_lm, describe_endpoint

    spec = judge_lm or folder.lm_spec
    if judge_lm is None:  # the run's own LM, at the run's own endpoint with its key variable
        recorded = folder.config.get("lm") or {}
        api_base = api_base or recorded.get("api_base")
        api_key_env = api_key_env or recorded.get("api_key_env")
    if lm is None:
        if not spec:
            raise RunError(f"{folder.path}: the run records no LM; give --judge-lm")
        lm = build_lm(spec, max_tokens=max_tokens, n_ctx=n_ctx or DEFAULT_N_CTX, api_base=api_base, api_key_env=api_key_env)
        print(f"hcqr judge: {folder.path}: judge LM {spec} at {describe_endpoint(lm.hcqr_config)}", file=sys.stderr)
        check_lm(lm)
    return lm, spec


def _judge_and_track(folder: RunFolder, retriever: Retriever, lm: Any, spec: str | None, mode: str, reasoning: bool,
                     mlflow_dir: str | Path | None, track: bool, num_threads: int, progress: bool, limit: int | None,
                     seed: int, ids: Sequence[str] | None) -> dict[str, Any]:
    """The part of :func:`judge_and_track` that writes, under the folder's writer lock."""
    from hcqr_dspy import tracking

    run_id = folder.mlflow_run_id
    tracked = bool(track and run_id and tracking.existing_run_id(run_id, mlflow_dir))
    if not tracked:
        return judge_run(folder, retriever, lm, mode=mode, reasoning=reasoning, judge_lm=spec,
                         num_threads=num_threads, progress=progress, limit=limit, seed=seed, ids=ids)
    import mlflow

    trace_tags = {"kind": "dur_judge", "judged_run_id": run_id, "method": folder.method, "dataset": folder.dataset_name,
                  "run_folder": str(folder.path.resolve()), "judge_lm": spec}
    with tracking.dspy_tracing():
        metrics = judge_run(folder, retriever, lm, mode=mode, reasoning=reasoning, judge_lm=spec,
                            num_threads=num_threads, progress=progress, trace_tags=trace_tags,
                            limit=limit, seed=seed, ids=ids)
    with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
        tracking.log_metrics(metrics)
        # tags, not params: MLflow params never change, and a run may be judged again with other settings
        mlflow.set_tags(tracking.flatten({"dur": metrics["judge"]}))
        if metrics.get("sample"):  # a metric, not a param: a later judging may widen the sample
            mlflow.log_metric("dur_sample_n", metrics["sample"]["n"])
        tracking.log_run_folder(folder)
        log_dur_feedback(folder)
    return metrics


# Assessment metadata that marks a DUR label logged by `hcqr judge` (a rerun does not log it twice).
JUDGE_FEEDBACK_SOURCE = "hcqr judge"


def log_dur_feedback(folder: RunFolder) -> int:
    """Log each DUR judgment of a run on its question's MLflow trace, once; labels an earlier judging
    with other settings left there are replaced.

    Feedback ``dur`` (the label, the judge's reasoning as rationale; an error for an invalid judgment),
    ``dur_positive_control`` and ``dur_negative_control``, source ``LLM_JUDGE`` (the judge LM), with
    metadata naming the judge's settings and its own trace (``judge_trace_id``). Questions without a
    trace in the current store, and traces that already hold a label from ``hcqr judge``, are skipped.

    Returns:
        How many questions got their labels now.
    """
    import mlflow
    from mlflow.entities import AssessmentError, AssessmentSource

    mlflow.flush_trace_async_logging()
    trace_ids = {r["qid"]: r.get("trace_id") for r in folder.rows()}
    logged = 0
    for j in folder.judgments():
        trace_id = trace_ids.get(j["qid"])
        trace = mlflow.get_trace(trace_id, silent=True) if trace_id else None
        if trace is None:
            continue
        source = AssessmentSource(source_type="LLM_JUDGE", source_id=str(j.get("judge_lm")))
        meta = {"source": JUDGE_FEEDBACK_SOURCE, "mode": str(j.get("mode")), "reasoning": str(j.get("reasoning")),
                **({"judge_trace_id": j["judge_trace_id"]} if j.get("judge_trace_id") else {})}
        ours = [a for a in trace.info.assessments if a.name in ("dur", "dur_positive_control", "dur_negative_control")
                and (a.metadata or {}).get("source") == JUDGE_FEEDBACK_SOURCE]
        if any(a.name == "dur" and a.metadata == meta and a.source.source_id == source.source_id for a in ours):
            continue  # this judgment is already on the trace
        for old in ours:  # labels of an earlier judging (other settings, or judged again): replaced
            mlflow.delete_assessment(trace_id=trace_id, assessment_id=old.assessment_id)
        if j["valid"]:
            mlflow.log_feedback(trace_id=trace_id, name="dur", value=j["label"], rationale=j.get("rationale"),
                                source=source, metadata=meta)
        else:
            mlflow.log_feedback(trace_id=trace_id, name="dur", source=source, metadata=meta,
                                error=AssessmentError(error_code="INVALID_JUDGMENT", error_message=str(j.get("error"))))
        for side in ("positive", "negative"):
            if j.get(f"{side}_label"):
                mlflow.log_feedback(trace_id=trace_id, name=f"dur_{side}_control", value=j[f"{side}_label"],
                                    source=source, metadata=meta)
        logged += 1
    return logged


def dur_metrics(judgments: list[dict[str, Any]]) -> dict[str, Any]:
    """DUR and label shares over valid judgments; invalid judgments counted apart; control rates.

    Returns:
        ``dur_n`` (judged), ``dur_invalid``, ``dur`` (share ENTAILED or
        USEFUL among valid), ``dur_entailed`` / ``dur_useful`` /
        ``dur_not_useful`` shares; ``dur_positive_control`` and
        ``dur_negative_control`` (the judge's ENTAILED-or-USEFUL rate on each
        control, over its valid control judgments, counted in
        ``dur_positive_control_n`` / ``dur_negative_control_n``); and for
        multi-query runs ``dur_role_q<i>``: among decision-useful contexts, the
        share holding a passage found by query i (in passage mode: a passage
        found by query i and itself labelled ENTAILED or USEFUL).
    """
    valid = [j for j in judgments if j["valid"]]
    out: dict[str, Any] = {"dur_n": len(judgments), "dur_invalid": len(judgments) - len(valid)}
    for side in ("positive", "negative"):
        labels = [j.get(f"{side}_label") for j in judgments if j.get(f"{side}_label") in LABELS]
        if labels:
            out[f"dur_{side}_control_n"] = len(labels)
            out[f"dur_{side}_control"] = sum(lab in USEFUL_LABELS for lab in labels) / len(labels)
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


def control_flags(dur: dict[str, Any]) -> list[str]:
    """Why a run's DUR cannot be trusted, from its control rates (:data:`CONTROL_LIMITS`); ``[]`` if none.

    A judged run without control judgments (judged before controls existed) is flagged too.
    """
    if not dur.get("dur_n"):
        return []
    flags = []
    neg, pos = dur.get("dur_negative_control"), dur.get("dur_positive_control")
    if pos is None and neg is None:
        return ["no control judgments (judged without controls): the judge is unchecked"]
    if neg is not None and neg > CONTROL_LIMITS["negative_max"]:
        flags.append(f"the judge calls {neg:.0%} of negative controls (another question's context) useful "
                     f"(> {CONTROL_LIMITS['negative_max']:.0%})")
    if pos is not None and pos < CONTROL_LIMITS["positive_min"]:
        flags.append(f"the judge calls only {pos:.0%} of positive controls (a context stating the answer) useful "
                     f"(< {CONTROL_LIMITS['positive_min']:.0%})")
    return flags
