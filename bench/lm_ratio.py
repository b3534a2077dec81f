"""HCQR / Simple RAG wall time, paired per question: both methods on each demo question back to back.

Usage:
    python bench/lm_ratio.py [--lm local:qwen2.5-coder-0.5b] [--limit 10] [--warmup 1] [--budget 15]
                             [--out bench/results.json]

``bench/lm_pipeline.py`` takes the ratio from one ``hcqr demo``, which runs every HCQR question first and every Simple
RAG question last, minutes apart; on a shared 2-core machine the speed of the same call drifts by 15-20% over
minutes, so that ratio carries the drift between the two phases. Here each demo question is answered by both methods
one right after the other, their order alternating from question to question (HCQR first on the first measured
question), so the drift falls on both alike, and the ratio comes with an interval:

- product: the method's program (``make_program``; HCQR's three queries and Simple RAG's question over one BM25
  index of the demo corpus, both fused into ``--budget`` passages, 15 by default as in the paper) through DSPy, the
  HCQR adapter and the in-process engine, DSPy's response cache off and the engine's prompt cache on, as in a real
  run. A question's wall time is the program call's: retrieval, every LM call and the answer step's option scoring.
- warm-up: the first ``--warmup`` demo questions are answered by both methods and not counted. A run fills the prompt
  cache with each stage's fixed prefix (the signature's instructions) once; over a study's hundreds of questions that
  first fill is negligible, over ten questions it is not.
- statistic: the ratio of the methods' mean wall times per question (the ``lm_pipeline`` figure), with a 95% paired
  bootstrap interval (``scipy.stats.bootstrap``, BCa, 9,999 resamples, seed 0; from 5 questions up), and the
  per-question ratios' median and extremes. HCQR's stages are kept too (seconds and tokens), which say where its
  extra time goes.

The ratio depends on the CPU as much as on the build: HCQR's hypothesis and rewrite steps generate about 150-250
tokens, Simple RAG's answer step mostly prefills 3,000, so a CPU whose prefill is fast against its generation gives a
higher ratio. The section records the CPU's model name.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: LiteLLM's packaged cost map, no fetch
REPO = Path(__file__).resolve().parents[1]
METHODS = ("hcqr", "simple_rag")
TARGET = 1.25  # the LM-path target for HCQR / Simple RAG wall time
MIN_FOR_INTERVAL = 5  # fewer questions: no bootstrap interval


def run_question(program, lm, q) -> dict:
    """One program call on one question: its wall seconds, LM calls, tokens and stage records.

    Raises:
        SystemExit: a reply came from a cache (the measurement would not be of the LM).
    """
    import dspy

    from hcqr_dspy.lm.adapter import HCQRAdapter

    t0 = time.perf_counter()
    with dspy.context(lm=lm, adapter=HCQRAdapter()):
        pred = program(question=q.question, options=q.options)
    seconds = time.perf_counter() - t0
    stages = pred.stages
    if any(s.get("cached_lm_calls") for s in stages.values()):
        raise SystemExit(f"bench: a reply on {q.qid} came from DSPy's cache; the measurement needs the LM")
    return {
        "id": q.qid,
        "seconds": round(seconds, 3),
        "lm_calls": sum(s.get("lm_calls", 0) for s in stages.values()),
        "prompt_tokens": sum(s.get("prompt_tokens", 0) for s in stages.values()),
        "completion_tokens": sum(s.get("completion_tokens", 0) for s in stages.values()),
        "valid": bool(pred.valid),
        "stages": {
            name: {k: s.get(k, 0) for k in ("seconds", "lm_calls", "prompt_tokens", "completion_tokens")}
            for name, s in stages.items()
        },
    }


def ratio_statistics(hcqr_s: list[float], simple_s: list[float]) -> dict:
    """Ratio of mean wall times, its 95% paired BCa bootstrap interval (``None`` under 5 questions), and the
    per-question ratios' median and extremes."""
    from scipy.stats import bootstrap

    h, s = np.asarray(hcqr_s, float), np.asarray(simple_s, float)
    per_question = h / s
    interval = None
    if len(h) >= MIN_FOR_INTERVAL:
        res = bootstrap(
            (h, s),
            lambda a, b, axis=-1: a.mean(axis=axis) / b.mean(axis=axis),
            paired=True,
            vectorized=True,
            n_resamples=9999,
            confidence_level=0.95,
            method="BCa",
            random_state=np.random.default_rng(0),
        )
        interval = [round(float(res.confidence_interval.low), 3), round(float(res.confidence_interval.high), 3)]
    return {
        "ratio_of_means": round(float(h.mean() / s.mean()), 3),
        "ratio_ci95": interval,
        "per_question_median": round(float(np.median(per_question)), 3),
        "per_question_range": [round(float(per_question.min()), 3), round(float(per_question.max()), 3)],
    }


def summarise(rows: list[dict]) -> dict:
    """Means per method of wall seconds, LM calls and tokens, the median seconds, and each stage's means."""
    out = {
        "questions": len(rows),
        "seconds_mean": round(float(np.mean([r["seconds"] for r in rows])), 2),
        "seconds_median": round(float(np.median([r["seconds"] for r in rows])), 2),
        "invalid": sum(not r["valid"] for r in rows),
    }
    for key in ("lm_calls", "prompt_tokens", "completion_tokens"):
        out[key] = round(float(np.mean([r[key] for r in rows])), 1)
    out["stages"] = {
        name: {k: round(float(np.mean([r["stages"][name][k] for r in rows])), 2) for k in rows[0]["stages"][name]}
        for name in rows[0]["stages"]
    }
    return out


def measure(lm_spec: str, limit: int, warmup: int, budget: int) -> dict:
    """Both methods on demo questions ``warmup`` .. ``warmup + limit - 1`` (after the uncounted warm-up ones)."""
    from demo_setup import demo_engine, demo_questions_and_index

    from hcqr_dspy.evaluation.provenance import cpu_model
    from hcqr_dspy.programs.method_registry import make_program

    lm, engine = demo_engine(lm_spec)
    questions, retriever = demo_questions_and_index(warmup + limit)
    programs = {m: make_program(m, retriever, budget=budget) for m in METHODS}
    rows: dict[str, list[dict]] = {m: [] for m in METHODS}
    warm: dict[str, list[float]] = {m: [] for m in METHODS}
    for i, q in enumerate(questions):
        order = METHODS if (i - warmup) % 2 == 0 else METHODS[::-1]
        for method in order:
            row = run_question(programs[method], lm, q)
            if i < warmup:
                warm[method].append(row["seconds"])
            else:
                rows[method].append(row)
            print(
                f"bench: {'warm-up' if i < warmup else f'{i - warmup + 1}/{limit}'} {q.qid} {method}: "
                f"{row['seconds']:.1f} s, {row['prompt_tokens']} + {row['completion_tokens']} tokens",
                file=sys.stderr,
                flush=True,
            )
    return {
        "model": lm.hcqr_config.model.split("/", 1)[-1],  # a packaged model's name (llama_cpp/<name>)
        "engine": {**engine.settings.record(), "build": engine.build, "n_ctx": engine.n_ctx},
        "cpu": cpu_model(),
        "warmup_seconds": warm,
        "methods": {m: {**summarise(rows[m]), "rows": rows[m]} for m in METHODS},
        **ratio_statistics([r["seconds"] for r in rows["hcqr"]], [r["seconds"] for r in rows["simple_rag"]]),
    }


def main(argv=None) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from demo_setup import bounded, budget_type, demo_questions
    from report import checked_out, write_results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lm", default="local:qwen2.5-coder-0.5b", help="a packaged model (local, local:<name>)")
    ap.add_argument("--limit", type=demo_questions, default=10, help="questions measured, 1 to 20")
    ap.add_argument(
        "--warmup",
        type=lambda t: bounded(t, 19, "the demo questions", low=0),
        default=1,
        help="questions answered first and not counted, 0 to 19 (default 1)",
    )
    ap.add_argument("--budget", type=budget_type, default=15, help="passages each method shows, 1 to 15 (default 15)")
    ap.add_argument(
        "--out", default=str(REPO / "bench" / "results.json"), help="results file (RESULTS.md is written beside it)"
    )
    args = ap.parse_args(argv)
    if args.warmup + args.limit > 20:
        ap.error(f"--warmup {args.warmup} + --limit {args.limit} exceeds the demo's 20 questions")
    out_path = checked_out(ap, args.out)  # refused before measuring
    section = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "limit": args.limit,
        "warmup": args.warmup,
        "budget": args.budget,
        "target": TARGET,
        **measure(args.lm, args.limit, args.warmup, args.budget),
    }
    write_results(out_path, section, key=f"lm_ratio/{section['model']}/{section['engine']['build']}")
    print(
        f"bench: HCQR / Simple RAG mean wall time {section['ratio_of_means']} "
        f"({'95% ' + str(section['ratio_ci95']) if section['ratio_ci95'] else 'no interval under 5 questions'}); "
        f"wrote {out_path} and {out_path.with_name('RESULTS.md')}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
