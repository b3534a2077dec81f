"""LM-path overhead, paired: each product call against raw llama.cpp on the same tokens, measured back to back.

Usage:
    python bench/lm_overhead.py [--lm local:qwen2.5-coder-0.5b] [--limit 10] [--budget 15] [--out bench/results.json]

``bench/lm_pipeline.py`` compares a demo run's stage seconds with raw rates measured once, after the run, best of two.
On a shared 2-core machine the speed of the same call drifts by about 20% over minutes (the per-call efficiency of
its 20-question runs spans 0.75 to 1.05 for calls of the same length), so that comparison measures the machine's
drift as much as the product's overhead. Here every product call is paired with raw llama.cpp on the same numbers
of tokens, measured right after it (seconds apart, so the machine's drift over minutes cancels), in the same process and
engine:

- product: the method's answer step on a demo question (Simple RAG: ``--budget`` passages, 15 by default as in the
  paper, from a BM25 index of the demo corpus, about 3,000 prompt tokens at 15; CoT: the question alone, about
  450), through DSPy, the HCQR adapter and the in-process engine with DSPy's response cache off; its seconds and
  tokens are what the program's stage record holds (what ``lm_pipeline`` reads from run folders).
- scoring: the answer step then scores the options (the letter distribution after its reasoning, for the
  gold-option probability: one teacher-forced prefill of the reply's tokens after the prompt it keeps in the KV
  cache, ``LlamaCppEngine.next_token_logprobs``). Its seconds and the tokens it evaluates are timed apart here
  (the stage record counts them in the answer stage's seconds but not in its tokens) and left out of the product's
  seconds; the efficiency with them included is kept too.
- raw: ``Llama.eval`` of that many prompt tokens from an empty KV cache, then that many tokens generated one at a
  time by greedy argmax (``Llama.eval`` a token): no template, grammar, sampler chain, detokenizing or Python around
  it.

A pair's efficiency is raw over product seconds; the section keeps, per method, the mean with its 95% t interval
(``statsmodels`` ``DescrStatsW.tconfint_mean``), the median and the extremes. Both start from an empty KV cache:
the engine's prompt cache is switched off here, so that the product evaluates every prompt token as raw does and the
ratio is its overhead alone (below 1: time beyond llama.cpp's own). What the prompt cache saves in real runs shows in
``lm_pipeline``'s stages above 1.
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
METHODS = ("simple_rag", "cot")


def raw_seconds(llm, pool: list[int], prompt: int, completion: int) -> float:
    """Seconds llama.cpp takes to prefill ``prompt`` tokens of ``pool`` from an empty KV cache and generate
    ``completion`` tokens greedily after them, one ``Llama.eval`` a token."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(pool[:prompt])
    for _ in range(completion):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        llm.eval([int(logits.argmax())])
    seconds = time.perf_counter() - t0
    llm.reset()
    return seconds


def summarise(pairs: list[dict]) -> dict:
    """Mean (95% t interval), median and extremes of the pairs' raw / product seconds, and their mean tokens."""
    from statsmodels.stats.weightstats import DescrStatsW

    ratios = np.array([p["raw_s"] / p["product_s"] for p in pairs])
    with_scoring = np.array([p["raw_s"] / (p["product_s"] + p["scoring_s"]) for p in pairs])
    low, high = DescrStatsW(ratios).tconfint_mean(alpha=0.05) if len(ratios) > 1 else (None, None)
    return {
        "pairs": len(pairs),
        "prompt_tokens": round(float(np.mean([p["prompt"] for p in pairs]))),
        "completion_tokens": round(float(np.mean([p["completion"] for p in pairs]))),
        "product_s_mean": round(float(np.mean([p["product_s"] for p in pairs])), 2),
        "raw_s_mean": round(float(np.mean([p["raw_s"] for p in pairs])), 2),
        "efficiency_mean": round(float(ratios.mean()), 3),
        "efficiency_ci95": [round(float(low), 3), round(float(high), 3)] if low is not None else None,
        "efficiency_median": round(float(np.median(ratios)), 3),
        "efficiency_range": [round(float(ratios.min()), 3), round(float(ratios.max()), 3)],
        "scoring_s_mean": round(float(np.mean([p["scoring_s"] for p in pairs])), 2),
        "scoring_tokens_mean": round(float(np.mean([p["scoring_tokens"] for p in pairs]))),
        "efficiency_with_scoring_mean": round(float(with_scoring.mean()), 3),
    }


def measure(lm_spec: str, limit: int, budget: int = 15) -> dict:
    """The paired measurements of each method on the first ``limit`` demo questions, Simple RAG showing ``budget``
    passages (see the module docstring)."""
    import dspy
    from demo_setup import demo_engine, demo_questions_and_index

    from hcqr_dspy.lm.adapter import HCQRAdapter
    from hcqr_dspy.programs.method_registry import make_program

    lm, engine = demo_engine(lm_spec)
    llm = engine.llm
    llm.set_cache(None)  # no prompt cache: every product call evaluates its whole prompt (see the module docstring)
    pool = llm.tokenize((REPO / "data" / "demo" / "corpus.jsonl").read_text().encode(), add_bos=False)
    questions, retriever = demo_questions_and_index(limit)
    programs = {m: make_program(m, retriever, **({"budget": budget} if m == "simple_rag" else {})) for m in METHODS}
    pairs: dict[str, list[dict]] = {m: [] for m in METHODS}
    scoring = {"s": 0.0, "tokens": 0, "on": False}  # the answer step's option-probability prefill, timed apart
    score, evaluate = engine.next_token_logprobs, llm.eval

    def timed_score(*args, **kwargs):
        scoring["on"], t0 = True, time.perf_counter()
        try:
            return score(*args, **kwargs)
        finally:
            scoring["on"], scoring["s"] = False, scoring["s"] + time.perf_counter() - t0

    def counted_eval(tokens):
        if scoring["on"]:
            scoring["tokens"] += len(tokens)
        return evaluate(tokens)

    engine.next_token_logprobs, llm.eval = timed_score, counted_eval
    for i, q in enumerate(questions):
        for method, program in programs.items():
            llm.reset()  # nor a prefix kept in the KV cache from the last call
            scoring.update(s=0.0, tokens=0)
            with dspy.context(lm=lm, adapter=HCQRAdapter()):
                pred = program(question=q.question, options=q.options)
            st = pred.stages["answer"]
            if st.get("lm_calls") != 1:
                raise SystemExit(f"bench: {method} made {st.get('lm_calls')} answer calls on {q.qid}, not one")
            p, c, scored_s, scored = st["prompt_tokens"], st["completion_tokens"], scoring["s"], scoring["tokens"]
            raw = raw_seconds(llm, pool, p, c)
            pairs[method].append(
                {
                    "id": q.qid,
                    "prompt": p,
                    "completion": c,
                    "product_s": st["seconds"] - scored_s,
                    "raw_s": raw,
                    "scoring_s": scored_s,
                    "scoring_tokens": scored,
                    "passages": len(pred.passages),  # what the answer step's context held
                }
            )
            print(
                f"bench: {method} {i + 1}/{len(questions)}: {p} + {c} tokens, product {st['seconds'] - scored_s:.2f} s "
                f"(+ scoring {scored} tokens {scored_s:.2f} s), raw {raw:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    return {
        "model": lm.hcqr_config.model.split("/", 1)[-1],  # a packaged model's name (llama_cpp/<name>)
        "engine": {**engine.settings.record(), "prompt_cache_mb": 0, "build": engine.build, "n_ctx": engine.n_ctx},
        "methods": {m: {**summarise(pairs[m]), "calls": pairs[m]} for m in METHODS},
    }


def main(argv=None) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from demo_setup import budget_type, demo_questions
    from report import checked_out, write_results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lm", default="local", help="a packaged model (local, local:<name>)")
    ap.add_argument("--limit", type=demo_questions, default=10, help="demo questions, 1 to 20 (pairs per method)")
    ap.add_argument(
        "--budget", type=budget_type, default=15, help="passages in Simple RAG's context, 1 to 15 (default 15)"
    )
    ap.add_argument(
        "--out", default=str(REPO / "bench" / "results.json"), help="results file (RESULTS.md is written beside it)"
    )
    args = ap.parse_args(argv)

    out_path = checked_out(ap, args.out)  # refused before measuring
    section = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "limit": args.limit,
        "budget": args.budget,
        **measure(args.lm, args.limit, args.budget),
    }
    write_results(out_path, section, key=f"lm_overhead/{section['model']}/{section['engine']['build']}")
    print(f"bench: wrote {out_path} and {out_path.with_name('RESULTS.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
