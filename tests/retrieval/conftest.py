"""Tiny BERT encoders built here (random weights, a vocabulary written here; nothing downloaded)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from helpers import TINY_ROWS, snippet, write_jsonl

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EXTRA_WORDS = (
    "microcytic low ferritin fatigable ptosis acetylcholine receptor antibodies exophthalmos tsh yellow vision".split()
)


def vocabulary() -> list[str]:
    words = {w for _, title, content in TINY_ROWS for w in re.findall(r"[a-z0-9]+", f"{title} {content}".lower())}
    return SPECIAL + sorted(words | set(EXTRA_WORDS)) + [".", ",", ";", "-"]


def make_tiny_bert(folder: Path, seed: int, hidden: int = 16) -> Path:
    """A 1-layer BERT with random weights (seeded) and a BERT tokenizer over :func:`vocabulary`, saved to ``folder``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(vocabulary()) + "\n", encoding="utf-8")
    BertTokenizer(str(vocab), do_lower_case=True).save_pretrained(str(folder))
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocabulary()),
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=600,
    )
    BertModel(config).eval().save_pretrained(str(folder))
    return folder


class BruteForce:
    """MedCPT's reference computation, straight from transformers: CLS of the last layer, raw inner product.

    Queries: ``tokenizer(queries, truncation=True, max_length=64)``; articles:
    ``tokenizer(titles, contents, truncation=True, max_length=512)`` (MedCPT
    model cards; MedRAG's retriever).
    """

    def __init__(self, query_dir: Path, article_dir: Path):
        from transformers import BertModel, BertTokenizer

        self.q_tok, self.q_model = (
            BertTokenizer.from_pretrained(str(query_dir)),
            BertModel.from_pretrained(str(query_dir)).eval(),
        )
        self.a_tok, self.a_model = (
            BertTokenizer.from_pretrained(str(article_dir)),
            BertModel.from_pretrained(str(article_dir)).eval(),
        )

    def queries(self, queries):
        import torch

        with torch.no_grad():
            enc = self.q_tok(list(queries), truncation=True, padding=True, max_length=64, return_tensors="pt")
            return self.q_model(**enc).last_hidden_state[:, 0].numpy()

    def articles(self, titles, contents):
        import torch

        with torch.no_grad():
            enc = self.a_tok(
                list(titles), list(contents), truncation=True, padding=True, max_length=512, return_tensors="pt"
            )
            return self.a_model(**enc).last_hidden_state[:, 0].numpy()

    def search(self, queries, passages, k):
        """Top ``k`` (id, score) per query by inner product over ``passages`` (a list of Passage)."""
        import numpy as np

        scores = self.queries(queries) @ self.articles([p.title for p in passages], [p.content for p in passages]).T
        out = []
        for row in scores:
            order = np.argsort(-row, kind="stable")[:k]
            out.append([(passages[i].id, float(row[i])) for i in order])
        return out


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """Two different tiny BERTs: (query folder, article folder)."""
    root = tmp_path_factory.mktemp("tiny-bert")
    return make_tiny_bert(root / "query", seed=1), make_tiny_bert(root / "article", seed=2)


@pytest.fixture(scope="session")
def brute(tiny_pair):
    return BruteForce(*tiny_pair)


@pytest.fixture(scope="session")
def medcpt_spec(tiny_pair):
    return f"medcpt:{tiny_pair[0]},{tiny_pair[1]}"


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` passages of 5-30 words drawn (seeded) from the tiny vocabulary."""
    rng = random.Random(seed)
    words = vocabulary()[len(SPECIAL) : -4]
    return [
        snippet(
            f"s{i}",
            " ".join(rng.choices(words, k=rng.randint(1, 4))),
            " ".join(rng.choices(words, k=rng.randint(5, 30))),
        )
        for i in range(n)
    ]


@pytest.fixture(scope="session")
def synthetic_corpus_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("synthetic") / "synthetic.jsonl", synthetic_rows(300))
