"""Lexical retrieval: Okapi BM25 through bm25s.

Text is lower-cased, split into word tokens, stripped of English stopwords
and Snowball-stemmed (PyStemmer's English stemmer), then scored with bm25s'
default BM25 variant and parameters (Lucene's BM25, k1=1.5, b=0.75;
Lù 2024, "BM25S: Orders of magnitude faster lexical search via eager
sparse scoring").

A saved BM25 index is bm25s's sparse score matrix (numpy ``.npy`` arrays)
and vocabulary (JSON); it is loaded memory-mapped (``bm25s.BM25.load(...,
mmap=True)``), so the score matrix stays on disk until searched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hcqr_dspy.errors import CorpusError, RetrievalIndexError
from hcqr_dspy.retrieval.passage_store import PassageStore
from hcqr_dspy.retrieval.retriever_base import Hit, Retriever
from hcqr_dspy.retrieval.retriever_registry import register

STOPWORDS = "en"
STEMMER_LANGUAGE = "english"


def _stemmer():
    import Stemmer

    return Stemmer.Stemmer(STEMMER_LANGUAGE)


@register("bm25")
class BM25Retriever(Retriever):
    """BM25 over ``title + "\\n" + content`` of each passage.

    Args:
        corpus: The passages.
        model: A fitted ``bm25s.BM25``; fitted on the corpus when omitted.
        show_progress: Show bm25s' progress bars while indexing.

    A query whose every token is a stopword or unseen in the corpus matches
    nothing and gets an empty hit list.
    """

    def __init__(self, corpus: PassageStore, model: Any = None, show_progress: bool = True):
        super().__init__(corpus)
        import bm25s

        self._stemmer = _stemmer()
        if model is None:
            tokens = bm25s.tokenize(
                corpus.texts(), stopwords=STOPWORDS, stemmer=self._stemmer, show_progress=show_progress
            )
            model = bm25s.BM25()
            if not tokens.vocab:
                raise CorpusError(
                    f"corpus {corpus.source!r}: no passage has an indexable word (after lower-casing, stopword "
                    "removal and stemming); BM25 needs text"
                )
            model.index(tokens, show_progress=show_progress)
        self.model = model
        self._vocab = model.vocab_dict

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        import bm25s

        token_lists = bm25s.tokenize(
            queries, stopwords=STOPWORDS, stemmer=self._stemmer, return_ids=False, show_progress=False
        )
        known = [[t for t in toks if t in self._vocab] for toks in token_lists]
        out: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, toks in enumerate(known) if toks]
        if not live:
            return out
        rows, scores = self.model.retrieve([known[i] for i in live], k=k, show_progress=False, n_threads=1)
        for i, rrow, srow in zip(live, rows, scores):
            keep = srow > 0
            out[i] = [Hit(pid, float(s)) for pid, s in zip(self.corpus.ids(rrow[keep]), srow[keep])]
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "stopwords": STOPWORDS,
            "stemmer": f"PyStemmer:{STEMMER_LANGUAGE}",
            "k1": self.model.k1,
            "b": self.model.b,
            "method": self.model.method,
        }

    def _write(self, folder: Path) -> None:
        self.model.save(str(folder / "bm25"))

    @classmethod
    def _read(cls, folder: Path, manifest: dict[str, Any], corpus: PassageStore, search_options: Any = None, **_: Any):
        import bm25s

        if search_options:
            raise RetrievalIndexError(
                f"index {folder} is a BM25 index: search options ({', '.join(search_options)}) apply to dense indexes"
            )
        # bm25s stores numpy arrays (np.load with allow_pickle=False, memory-mapped) and JSON: no pickle.
        model = bm25s.BM25.load(str(folder / "bm25"), mmap=True, allow_pickle=False, show_progress=False)
        return cls(corpus, model=model)
