"""The report's program section: how each saved (compiled) program's instructions and demos differ
from the zero-shot program of its own method (the reference run's program when no run is that), per
predictor."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.optimize.saved import fresh_state
from hcqr_dspy.reporting.compiled import zero_shot_partner
from hcqr_dspy.reporting.runs import Run


def program_state(run: Run) -> dict[str, Any] | None:
    """The run's program state (instructions, demos per predictor): a saved program's ``program.json``
    (:attr:`~hcqr_dspy.reporting.runs.Run.program`, read once per comparison), else the zero-shot program rebuilt
    from the method and its recorded options; ``None`` if unavailable."""
    if run.config.get("saved_program"):
        return run.program.state if run.program is not None else None
    try:
        return fresh_state(run.config.get("method"), run.config.get("program") or {})
    except HCQRError:
        return None


def shown_demos(run: Run) -> dict[str, dict[str, int]] | None:
    """Each stage's demos of a saved program as its prompts show them
    (:attr:`~hcqr_dspy.reporting.saved_programs.ProgramFolder.demo_counts`: bootstrapped, labelled, rendered,
    saved); ``None`` for a zero-shot run or a program folder that cannot be loaded."""
    return run.program.demo_counts if run.program is not None else None


def _demo_text(count: dict[str, int] | None, saved: int) -> str:
    if count is None:
        return str(saved) if saved == 0 else f"{saved} saved"
    text = f"{count['rendered']} shown ({count['bootstrapped']} bootstrapped, {count['labelled']} labelled"
    return text + (f"; {count['saved']} saved)" if count["saved"] != count["rendered"] else ")")


def program_diff(runs: Sequence[Run], reference: Run) -> str | None:
    """Markdown: how each saved program's instructions and demos differ, per predictor, from the zero-shot
    run of its own method (:func:`~hcqr_dspy.reporting.compiled.zero_shot_partner`), else from the reference's.
    Demos are counted as the prompts show them (:func:`shown_demos`); a zero-shot program's or an unloadable
    folder's as saved.

    ``None`` when no run ran a saved program (then there is nothing to diff).
    """
    if not any(r.config.get("saved_program") for r in runs):
        return None
    parts = []
    for run in runs:
        if run is reference or not run.config.get("saved_program"):
            continue
        base = zero_shot_partner(run, runs, reference) or reference
        ref_state = program_state(base)
        state = program_state(run)
        saved = run.config["saved_program"]
        parts.append(
            f"### {run.label} vs {base.label}\n\noptimizer: {saved.get('optimizer')}, recipe: "
            f"{saved.get('recipe')}, compiled on {saved.get('train_count')} {saved.get('train_dataset')} "
            "questions"
        )
        if state is None or ref_state is None:
            parts.append("(program state unavailable)")
            continue
        counts, ref_counts = shown_demos(run) or {}, shown_demos(base) or {}
        for name in sorted(k for k in state if k != "metadata"):
            mine, theirs = state.get(name) or {}, ref_state.get(name) or {}
            a = (theirs.get("signature") or {}).get("instructions", "")
            b = (mine.get("signature") or {}).get("instructions", "")
            demos_a, demos_b = theirs.get("demos") or [], mine.get("demos") or []
            lines = [
                f"**{name}**: demos {_demo_text(ref_counts.get(name), len(demos_a))} -> "
                f"{_demo_text(counts.get(name), len(demos_b))}; instructions " + ("unchanged" if a == b else "changed")
            ]
            if a != b:
                diff = difflib.unified_diff(a.splitlines(), b.splitlines(), base.label, run.label, lineterm="")
                lines.append("```diff\n" + "\n".join(diff) + "\n```")
            for i, demo in enumerate(demos_b, start=1):
                q = " ".join(str(demo.get("question", "")).split())[:100]
                extra = ", ".join(
                    f"{k}={str(v)[:40]!r}" for k, v in demo.items() if k not in ("question", "options", "augmented")
                )
                lines.append(f"- demo {i}: {q} ... ({extra})")
            parts.append("\n".join(lines))
    return "\n\n".join(parts)
