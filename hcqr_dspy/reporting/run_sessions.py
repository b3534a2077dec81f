"""Where a compared run's rows and judgments were made: its sessions summarized (``sessions.jsonl``)
and the Runs section's note on them."""

from __future__ import annotations

from typing import Any

from hcqr_dspy.evaluation.provenance import machine_key
from hcqr_dspy.reporting.runs import Run


def session_summary(run: Run) -> dict[str, Any]:
    """Where a run's rows and judgments were made (``sessions.jsonl``): ``sessions`` (``hcqr eval`` sessions),
    ``machines`` (their :func:`hcqr_dspy.evaluation.provenance.machine_key`, oldest first), ``rows_before_sessions``
    (rows written before the first recorded eval session: all of them for a run without one) and
    ``judge_sessions`` / ``judge_machines`` likewise for ``hcqr judge``."""
    records = run.folder.sessions()
    evals = [s for s in records if s.get("command") == "eval"]
    judges = [s for s in records if s.get("command") == "judge"]
    return {
        "sessions": len(evals),
        "machines": list(dict.fromkeys(machine_key(s) for s in evals)),
        "rows_before_sessions": evals[0]["predictions_before"] if evals else len(run.folder.predictions.read()),
        "judge_sessions": len(judges),
        "judge_machines": list(dict.fromkeys(machine_key(s) for s in judges)),
    }


def provenance_line(summary: dict[str, Any]) -> str:
    """The Runs section's note on where a run's rows (and judgments) were made, from its :func:`session_summary`."""

    def where(machines: list[str]) -> str:
        return (
            f"on one machine: {machines[0]}"
            if len(machines) == 1
            else f"on {len(machines)} different machines or LM stacks: " + " | ".join(machines)
        )

    parts = []
    if summary["sessions"]:
        parts.append(f"rows written in {summary['sessions']} session(s) {where(summary['machines'])}")
    if summary["rows_before_sessions"]:
        parts.append(
            f"{summary['rows_before_sessions']} row(s) written before sessions were recorded (machine unknown)"
        )
    if summary["judge_sessions"]:
        parts.append(f"judged in {summary['judge_sessions']} session(s) {where(summary['judge_machines'])}")
    return "; ".join(parts)
