"""``hcqr rescore``: give a finished run folder's rows the answer step's letter distribution, without generating.

For every row that holds no ``option_probs`` yet, the answer step's prompt is rebuilt as the question saw it
(the run's program, saved or fresh; the context from the row's shown passages through the run's index; the
demos as shown; :meth:`hcqr_dspy.programs.program_base.MCQProgram.answer_inputs`), the reasoning the row records is fed
back after it, and the letter distribution is read at the answer slot in one prefill
(:mod:`hcqr_dspy.programs.answer_slot_probs`). Records go to the folder's ``option_probs.jsonl`` as they are made
(resumable; the predictions are not rewritten), under the folder's writer lock, and the session that scored is
recorded in ``sessions.jsonl`` (machine, llama.cpp build and engine settings).

Only an LM that gives its next-token distribution can score (the in-process llama.cpp engine); the run's own
LM is used unless another is given, and the record names the scorer (``scored_by``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import LMSpecError, RunError
from hcqr_dspy.evaluation.lock import WriterLock
from hcqr_dspy.evaluation.loop import run_resumable
from hcqr_dspy.evaluation.option_probs import folder_rows_with_option_probs
from hcqr_dspy.evaluation.rows import gold_probability
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.judge.run_judging import check_judge_index
from hcqr_dspy.lm import DEFAULT_N_CTX, LlamaCppEngine, build_lm
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.lm.model_file import gguf_sha256
from hcqr_dspy.programs import PROGRAMS
from hcqr_dspy.retrieval import load_index
from hcqr_dspy.workflows.programs import run_program

log = logging.getLogger(__name__)


def rescore_run(
    run: str | Path | RunFolder,
    lm_spec: str | None = None,
    lm: Any = None,
    index: str | Path | None = None,
    n_ctx: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Score every row of ``run`` that lacks the answer step's letter distribution (see the module docstring).

    Args:
        run: The run folder.
        lm_spec: The scoring LM's spec (default: the run's own LM).
        lm: A ready ``dspy.LM`` instead (tests); ``lm_spec`` is still what is recorded.
        index: The index that resolves the shown passages (default: the run's own; checked against its corpus).
        n_ctx: Context window of the scoring model (default: the run's).
        progress: Show a progress bar.

    Returns:
        ``{"run", "scored", "resumed", "already", "absent", "scored_by"}``: questions scored now, found in
        ``option_probs.jsonl`` from an earlier call, holding a distribution of their own, and left without one
        (no reasoning recorded).

    Raises:
        LMSpecError: the LM gives no next-token distribution (not an in-process llama.cpp model).
        RunError: not a run folder, a run without an LM, an index over another corpus, or (the run's own LM)
            a ``gguf:`` file whose bytes changed since the run.
    """
    import dspy
    from dspy.lm15 import ContextLengthError

    folder = run if isinstance(run, RunFolder) else RunFolder.open(run)
    spec = lm_spec or folder.lm_spec
    if lm is None and not spec:
        raise RunError(f"{folder.path}: the run records no LM; give --lm")
    rows = folder.rows()
    folder_rows_with_option_probs(folder)  # a malformed or foreign option_probs.jsonl is refused before any work
    todo = [r for r in rows if r.get("option_probs") is None]
    with WriterLock(folder.path, "rescore"):
        scored = {r.get("qid") for r in folder.option_probs_table.read()}
        pending = any(r["qid"] not in scored for r in todo)
        program = questions = None
        if pending:  # every check before the model loads; a run with nothing left to score loads none
            if folder.method in PROGRAMS and PROGRAMS[folder.method].uses_retrieval:
                program = run_program(folder, load_index(check_judge_index(folder, index)))
            else:
                program = run_program(folder)
            questions = folder.load_questions()
            if lm is None:
                recorded = folder.config.get("lm") or {}
                if not lm_spec:
                    _check_model_file(folder, recorded)
                lm = build_lm(spec, n_ctx=n_ctx or recorded.get("n_ctx") or DEFAULT_N_CTX)
            if not isinstance(getattr(lm, "engine", None), LlamaCppEngine):
                raise LMSpecError(
                    "rescoring needs an LM that gives its next-token distribution (a local or gguf: model), "
                    f"not {spec!r}"
                )

        def score(row: dict[str, Any]) -> dict[str, Any]:
            example = questions[row["qid"]]
            options = dict(example.options)
            inputs = program.answer_inputs(row, example.question, options)
            try:
                probs, absent = program.option_probabilities(program.answer, options, row.get("reasoning"), **inputs)
            except ContextLengthError as exc:  # a window smaller than the run's: refuse, nothing recorded
                raise RunError(
                    f"{folder.path}: question {row['qid']}: {str(exc).splitlines()[0]}; give --n-ctx of at least "
                    f"the run's ({(folder.config.get('lm') or {}).get('n_ctx', DEFAULT_N_CTX)})"
                ) from None
            return {
                "qid": row["qid"],
                "option_probs": probs,
                "gold_prob": gold_probability(probs, example.answer),
                "option_probs_absent": absent,
                "scored_by": spec,
            }

        if pending:  # which machine and llama.cpp build scored them
            folder.record_session("rescore", lm)
        with dspy.context(lm=lm, adapter=HCQRAdapter()):
            records, resumed, now = run_resumable(
                folder.option_probs_table, todo, lambda r: r["qid"], score, stop_errors=(), progress=progress
            )
    summary = {
        "run": str(folder.path),
        "scored": now,
        "resumed": resumed,
        "already": len(rows) - len(todo),
        "absent": sum(r["option_probs"] is None for r in records),
        "scored_by": spec,
    }
    log.info(
        f"hcqr rescore: {folder.path}: {now} scored now, {resumed} earlier, {summary['already']} held their own, "
        f"{summary['absent']} without reasoning to score"
    )
    return summary


def _check_model_file(folder: RunFolder, recorded: dict[str, Any]) -> None:
    """The run's ``gguf:`` file is still the one it ran (the recorded SHA-256), where it recorded one: another
    model's distribution is not the run's answer step's.

    Raises:
        RunError: the file at the recorded path has other bytes.
    """
    path = recorded.get("path")
    if "sha256" in recorded and path and Path(path).is_file() and gguf_sha256(path) != recorded["sha256"]:
        raise RunError(
            f"{folder.path}: the run's model file {path} changed since the run (its SHA-256 is not the recorded "
            f"one); to score with it anyway, name it: --lm gguf:{path}"
        )
