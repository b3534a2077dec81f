"""The serving section of ``RESULTS.md`` (:mod:`bench.serving`'s results)."""

from __future__ import annotations


def render_serving(s: dict) -> list[str]:
    lines = [
        "",
        f"## Serving: requests per minute on MLflow's scoring server ({s['date']}, {s['machine']})",
        "",
        "A registered zero-shot HCQR program served by `mlflow models serve` (`bench/serving.py`); its LM is the tests'"
        f" stub OpenAI-compatible server waiting {s['lm_delay_seconds']} s before each reply"
        f" ({s['lm_calls_per_question']} calls a question), so the figures measure the serving path, not an LM."
        " Every question text is new (no DSPy cache hit); served questions are traced into the store.",
        "",
        "| questions per request | threads | requests | mean s per request | requests / min | questions / min |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(s["rows"], key=lambda r: (r["questions_per_request"], -r["threads"])):
        lines.append(
            f"| {r['questions_per_request']} | {r['threads']} | {r['requests']} | {r['mean_request_seconds']} | "
            f"{r['requests_per_minute']} | {r['questions_per_minute']} |"
        )
    return lines
