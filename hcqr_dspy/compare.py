"""Tables over finished runs (the paired statistics build on this)."""

from __future__ import annotations

from typing import Any, Sequence


def metrics_table(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Markdown table of accuracy ± standard error, invalid answers and cost per question.

    Args:
        runs: ``(label, metrics)`` pairs, metrics from :func:`hcqr_dspy.metrics.summarize`.
    """
    lines = [
        "| method | n | accuracy | ± SE | invalid | LM calls/q | prompt tok/q | completion tok/q | s/q |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, m in runs:
        if not m.get("n"):
            lines.append(f"| {label} | 0 | – | – | – | – | – | – | – |")
            continue
        lines.append(
            f"| {label} | {m['n']} | {m['accuracy']:.1%} | {m['accuracy_se']:.1%} | {m['invalid']} "
            f"({m['invalid_rate']:.0%}) | {m['mean_lm_calls']:.1f} | {m['mean_prompt_tokens']:.0f} | "
            f"{m['mean_completion_tokens']:.0f} | {m['mean_seconds']:.1f} |"
        )
    return "\n".join(lines)
