"""Shared by the program tests: the question, a spying retriever, DummyLM runs and prompt lookup."""

from __future__ import annotations

import dspy

from hcqr_dspy.retrieval import BM25Retriever, Hit

QUESTION = "A 70-year-old woman on digoxin reports nausea and yellow-tinted vision. What explains this?"
OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Iron deficiency anemia", "D": "Myasthenia gravis"}
ANSWER = {"reasoning": "Glycoside excess.", "answer": "A"}


class SpyRetriever(BM25Retriever):
    """BM25 over the tiny corpus, recording every ``search(queries, k)`` call."""

    def __init__(self, corpus):
        super().__init__(corpus, show_progress=False)
        self.calls = []

    def search(self, queries, k):
        self.calls.append((list(queries), k))
        return super().search(queries, k)


class PoolRetriever(SpyRetriever):
    """A deterministic pool: query ``j`` gets the corpus in order, rotated by ``j`` (the first query p1..p8,
    the second p2..p8, p1, ...), scores descending."""

    def _search(self, queries, k):
        ids = [p.id for p in self.corpus]
        rotated = [(ids[j % len(ids) :] + ids[: j % len(ids)])[:k] for j in range(len(queries))]
        return [[Hit(pid, float(k - i)) for i, pid in enumerate(hits)] for hits in rotated]


def run(program, lm, question=QUESTION, options=OPTIONS):
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        return program(question=question, options=options)


def prompts(lm, field):
    """The last message of every LM call whose prompt asks for the output ``field``."""
    return [h["messages"][-1]["content"] for h in lm.history if f"`{field}`" in h["messages"][-1]["content"]]


def full_prompts(lm, field):
    """All messages (system + user) of every LM call that asks for ``field``, joined."""
    return [
        "\n".join(m["content"] for m in h["messages"])
        for h in lm.history
        if f"`{field}`" in h["messages"][-1]["content"]
    ]
