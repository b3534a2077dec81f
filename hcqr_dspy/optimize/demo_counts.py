"""Few-shot demos counted as the LM sees them, and the demos a compiled program keeps.

DSPy's adapters render a predictor's demos into its prompt (``dspy.adapters.base.Adapter.format_demos``): a demo
holding every field of the signature as a complete example, one holding at least one input *and* one output
field as an incomplete one ("some input or output fields are not supplied"), and any other demo not at all. A
bare labelled training question (question, options, answer) therefore reaches an answer step (whose outputs
include ``answer``) but not HCQR's hypothesis or rewrite steps, whose outputs it lacks: counting
``predictor.demos`` called those stages few-shot while their prompts were zero-shot. Here demos are counted by
rendering each one with the adapter itself (:func:`renders`), bootstrapped traces (DSPy's ``augmented=True``)
and labelled examples apart (:func:`stage_demos`).

A compile keeps only demos the adapter renders (:func:`keep_rendered_demos`, called by
:func:`hcqr_dspy.optimize.recipe_compile.compile_program` with the recipe's ``demo_predictors``), and shows a labelled
example's options as the live question's are (``A. text`` lines; :func:`~hcqr_dspy.data.format_options`), so
that the saved program, its Prompt Registry versions and the counts reported all hold what the prompts hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dspy

from hcqr_dspy.data import format_options
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.optimize.saved import NoRetriever, load_program

COUNT_KEYS = ("bootstrapped", "labelled", "rendered", "saved")


def default_adapter() -> dspy.Adapter:
    """The adapter of the caller's ``dspy.context``, else the one every command uses (:class:`HCQRAdapter`)."""
    return dspy.settings.adapter or HCQRAdapter(response_format="off")


def renders(adapter: dspy.Adapter, signature: type[dspy.Signature], demo: Any) -> bool:
    """Whether ``adapter`` puts ``demo`` into a prompt of ``signature`` (its own ``format_demos``)."""
    return bool(adapter.format_demos(signature, [demo]))


def bootstrapped(demo: Any) -> bool:
    """A bootstrapped trace (DSPy marks them ``augmented=True``), not a labelled training example."""
    return bool(demo.get("augmented", False)) if hasattr(demo, "get") else False


def stage_demos(program: dspy.Module, adapter: dspy.Adapter | None = None) -> dict[str, dict[str, int]]:
    """Each predictor's demos as its prompt holds them.

    Returns:
        ``{stage: {"bootstrapped", "labelled", "rendered", "saved"}}`` in predictor order: bootstrapped traces and
        labelled examples the adapter renders, their sum, and the demos the predictor holds (``saved``; more than
        ``rendered`` where some are never shown).
    """
    adapter = adapter or default_adapter()
    out = {}
    for name, predictor in program.named_predictors():
        shown = [d for d in predictor.demos if renders(adapter, predictor.signature, d)]
        traces = sum(bootstrapped(d) for d in shown)
        out[name] = {
            "bootstrapped": traces,
            "labelled": len(shown) - traces,
            "rendered": len(shown),
            "saved": len(predictor.demos),
        }
    return out


def keep_rendered_demos(
    program: dspy.Module, names: list[str] | None = None, adapter: dspy.Adapter | None = None
) -> dict[str, int]:
    """Keep, in place, the demos each predictor shows: none for a predictor not in ``names`` (``None``: every
    predictor keeps its own), none the adapter would skip; a kept labelled example's ``options`` mapping is written
    as the live question's ``A. text`` lines (a copy: the training example is untouched).

    Returns:
        ``{stage: demos removed}`` for the stages that lost any.
    """
    adapter = adapter or default_adapter()
    removed = {}
    for name, predictor in program.named_predictors():
        kept = []
        if names is None or name in names:
            kept = [_as_shown(d) for d in predictor.demos if renders(adapter, predictor.signature, d)]
        if len(kept) < len(predictor.demos):
            removed[name] = len(predictor.demos) - len(kept)
        predictor.demos = kept
    return removed


def _as_shown(demo: Any) -> Any:
    options = demo.get("options") if hasattr(demo, "get") else None
    if not isinstance(options, dict):
        return demo
    if isinstance(demo, dspy.Example):
        return demo.copy(options=format_options(options))
    return {**demo, "options": format_options(options)}


def bootstrap_shortfall(asked: int, counts: dict[str, dict[str, int]]) -> dict[str, int] | None:
    """``{"asked", "bootstrapped"}`` when the compiled program's stages hold fewer bootstrapped traces than the
    recipe asked for (``asked``: max_bootstrapped_demos; ``bootstrapped``: the most any stage shows), else
    ``None``."""
    got = max((c["bootstrapped"] for c in counts.values()), default=0)
    return {"asked": asked, "bootstrapped": got} if asked > got else None


def shortfall_warning(shortfall: dict[str, int], optimizer: str, seed: int | None = None) -> str:
    """One line saying that a compile (of compile seed ``seed``, where given) bootstrapped fewer traces than asked."""
    which = optimizer if seed is None else f"{optimizer} (seed {seed})"
    return (
        f"warning: {which} kept {shortfall['bootstrapped']} bootstrapped trace(s) per stage, fewer than the "
        f"{shortfall['asked']} asked (max_bootstrapped_demos): too few training questions passed the metric, or "
        "the optimizer chose fewer; the stages' other demos are labelled examples or none"
    )


def count_saved_program(folder: str | Path, adapter: dspy.Adapter | None = None) -> dict[str, dict[str, int]]:
    """:func:`stage_demos` of a saved program folder, read without changing it (checked against its recorded
    SHA-256 as any load is; built over no retriever: nothing is run).

    Raises:
        ProgramFormatError: see :func:`hcqr_dspy.optimize.saved.load_program`.
    """
    program, _ = load_program(folder, NoRetriever())
    return stage_demos(program, adapter)
