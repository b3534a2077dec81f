"""A saved program's answer step inside another method: the bounds of a study under compiled prompts.

Every method that answers from a context (Simple RAG, HCQR, the oracle-context ceiling, the no-context floor
and the other retrieval baselines) answers with one ``dspy.Predict`` named ``answer`` over the same
signature (:class:`~hcqr_dspy.programs.signatures.AnswerQuestion`: question, options, context ->
reasoning, answer). An optimizer changes that predictor's instructions and demos. Copying them into a fresh
method asks what the compiled answer step does when the context changes, e.g. whether optimizing HCQR
raises the oracle-context ceiling (``hcqr eval --method oracle_rag --answer-step programs/hcqr-bfs``). The
retrieval and query steps of the receiving method stay its own, zero-shot.

DSPy keeps a predictor's prompt in its state (``Predict.dump_state``: ``demos`` and ``signature``, i.e. the
instructions and field prefixes), so the copy is that state, loaded with ``Predict.load_state``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hcqr_dspy.errors import ProgramFormatError
from hcqr_dspy.optimize.saved import NoRetriever, SavedProgram, read_saved_program

ANSWER_PREDICTOR = "answer"


def answer_predictor(program: Any, what: str) -> Any:
    """``program``'s answer step (its predictor named ``answer``).

    Raises:
        ProgramFormatError: ``program`` has no predictor of that name (``what`` names it in the message).
    """
    predictors = dict(program.named_predictors())
    if ANSWER_PREDICTOR not in predictors:
        raise ProgramFormatError(f"{what} has no answer step (predictors: {', '.join(sorted(predictors)) or 'none'})")
    return predictors[ANSWER_PREDICTOR]


def adopt_answer_step(program: Any, source: SavedProgram | str | Path) -> None:
    """Give ``program`` (a fresh method) the answer step of the saved program ``source``: its instructions,
    its demos and the length its demos' contexts are cut to (``demo_context_tokens``).

    Args:
        program: A fresh program whose ``answer`` predictor is replaced in place.
        source: The saved program as read (:class:`~hcqr_dspy.optimize.saved.SavedProgram`), or its folder (from
            ``hcqr compile``; an MLflow URI resolved to one by the caller), read here.

    Raises:
        ProgramFormatError: the saved program does not load, either program has no answer step, or the two
            answer steps have different input or output fields (a different signature: e.g. HCQR with the
            hypothesis shown, whose answer step also reads the hypothesis).
    """
    record = source if isinstance(source, SavedProgram) else read_saved_program(source)
    source, meta = record.folder, record.meta
    saved = record.build(NoRetriever())
    theirs = answer_predictor(saved, f"saved program {source} ({meta['method']})")
    ours = answer_predictor(program, f"method {program.method!r}")
    if list(theirs.signature.fields) != list(ours.signature.fields):
        raise ProgramFormatError(
            f"saved program {source} ({meta['method']}) answers from fields {list(theirs.signature.fields)}, "
            f"method {program.method!r} from {list(ours.signature.fields)}: its answer step does not fit"
        )
    ours.load_state(theirs.dump_state())
    program.demo_context_tokens = saved.demo_context_tokens
