"""What the LM-path benchmarks on the demo share: their argparse types, the in-process engine and the demo's questions
and BM25 index (``bench/lm_overhead.py``, ``bench/lm_ratio.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo"


def bounded(text: str, high: int, what: str, low: int = 1) -> int:
    """``text`` as an integer from ``low`` to ``high`` (the scripts' argparse types); ``what`` names the bound."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not low <= n <= high:
        raise argparse.ArgumentTypeError(f"{n} is not between {low} and {high} ({what})")
    return n


def demo_questions(text: str) -> int:
    """``--limit``: an integer from 1 to the demo's 20 questions (argparse type)."""
    return bounded(text, 20, "the demo questions")


def budget_type(text: str) -> int:
    """``--budget``: an integer from 1 to 15, the paper's budget (argparse type)."""
    return bounded(text, 15, "the paper's budget")


def demo_engine(lm_spec: str):
    """``(lm, engine)``: the DSPy LM of a packaged model, DSPy's response cache off, and its in-process engine.

    Raises:
        SystemExit: the model is unknown or not installed, or it is not an in-process llama.cpp model.
    """
    from hcqr_dspy.errors import HCQRError
    from hcqr_dspy.lm import build_lm

    try:
        lm = build_lm(lm_spec, cache=False)
    except HCQRError as exc:
        raise SystemExit(f"bench: {exc}") from None
    engine = getattr(lm, "engine", None)
    if not hasattr(engine, "llm"):
        raise SystemExit(f"bench: {lm_spec} is not an in-process llama.cpp model")
    return lm, engine


def demo_questions_and_index(n: int):
    """``(questions, retriever)``: the first ``n`` demo questions and a BM25 index of the demo corpus."""
    from hcqr_dspy.data import load_questions
    from hcqr_dspy.retrieval import build_retriever, load_corpus

    questions = load_questions(DEMO / "questions.json")[:n]
    return questions, build_retriever(load_corpus(DEMO / "corpus.jsonl"), "bm25", show_progress=False)
