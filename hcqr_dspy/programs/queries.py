"""Cleaning the search queries an LM writes, shared by every method whose LM writes them.

:func:`clean_query` turns a reply into a usable query or ``None`` (labels, list markers and quotes
stripped, at most :data:`MAX_QUERY_WORDS` words; content-free text, echoed field names and copies of the
prompts' example queries rejected); :func:`dedupe` marks repeats; :func:`is_content_free` and
:func:`key_terms` tell what, if anything, a text gives a search engine to look for.
"""

from __future__ import annotations

import re

from hcqr_dspy.programs.signatures import PROMPT_EXAMPLE_QUERIES, QUERY_FIELD_NAMES

MAX_QUERY_WORDS = 32


# Option texts that carry no searchable content (PubMedQA/BioASQ-style answers).
CONTENT_FREE_OPTIONS = {"yes", "no", "maybe", "true", "false", "unknown", "none of the above", "all of the above"}
# Words that only join option letters ("A and B", "both A and C", "options B, D").
_LETTER_LIST_WORDS = {
    "and",
    "or",
    "both",
    "neither",
    "nor",
    "either",
    "option",
    "options",
    "versus",
    "vs",
    "all",
    "none",
}


def is_content_free(text: object) -> bool:
    """Whether ``text`` holds nothing to search for: empty, a yes/no/maybe-style answer
    (:data:`CONTENT_FREE_OPTIONS`), a list of option letters (``"A; B; C"``, ``"both A and C"``), or
    any mix of those words, option letters, joiners and English stopwords (``"no Yes"``, ``"yes or
    no"``, ``"Yes, B"``, ``"None of these"``; stopwords: bm25s' STOPWORDS_EN_PLUS, as :func:`key_terms`)."""
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    if not isinstance(text, str):
        return True
    words = re.findall(r"[A-Za-z0-9]+", text)
    if not words:
        return True
    if " ".join(w.lower() for w in words) in CONTENT_FREE_OPTIONS:
        return True
    empty = _CONTENT_FREE_WORDS | _LETTER_LIST_WORDS | set(STOPWORDS_EN_PLUS)
    return all((len(w) == 1 and w.isalpha()) or w.lower() in empty for w in words)


_CONTENT_FREE_WORDS = {w for option in CONTENT_FREE_OPTIONS for w in option.split()}


def key_terms(text: str, max_words: int = 16) -> str:
    """The content words of ``text`` in order: lower-cased word tokens without English stopwords
    (bm25s' extended English list, STOPWORDS_EN_PLUS: 179 words) or digits-only tokens, each once, at most
    ``max_words``."""
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    stop = set(STOPWORDS_EN_PLUS)
    out: list[str] = []
    for w in re.findall(r"[A-Za-z][A-Za-z0-9'-]*", text):
        lw = w.lower().strip("'-")
        if len(lw) > 1 and lw not in stop and lw not in out:
            out.append(lw)
        if len(out) == max_words:
            break
    return " ".join(out)


def clean_query(text: object, max_words: int = MAX_QUERY_WORDS) -> str | None:
    """A usable search query, or ``None``.

    Strips quotes, list markers (``1.``, ``-``), labels like ``q1:`` or
    ``query 2:``, a leading option letter (``A. Fava beans``) and whitespace; keeps at most ``max_words``
    words (the 1.5B model's "queries" were often 30-60-word copies of its reasoning). Unusable:
    empty text, content-free text (:func:`is_content_free`: letter lists such as
    ``"A; B; C"``, a bare "yes"/"no", "no Yes"), a template placeholder or an output
    field's name echoed back (``{support_query}``, seen with SmolLM2-135M; ``<support_query>``,
    ``support_query``: :data:`~hcqr_dspy.programs.signatures.QUERY_FIELD_NAMES`), and a copy of one of the
    example queries the prompts show (:data:`~hcqr_dspy.programs.signatures.PROMPT_EXAMPLE_QUERIES`), also
    one that differs only in punctuation, stopwords or word order (the same :func:`key_terms`).
    """
    if not isinstance(text, str) or re.fullmatch(r"\s*[{\[<][\w ]*[}\]>]\s*", text):
        return None  # missing, or a template placeholder echoed back ("{support_query}", "<support_query>")
    if _normalized(text.replace("_", " ")) in {_normalized(f.replace("_", " ")) for f in QUERY_FIELD_NAMES}:
        return None  # an output field's name echoed back bare ("support_query")
    q = re.sub(r"^\s*(?:[-*\u2022]|\d{1,2}[.)])\s+", "", text.strip())
    q = re.sub(r"^\s*(q\d|query(\s*\d)?|support|distinction|key[ _]features?)\s*[:\-]\s*", "", q, flags=re.I)
    q = re.sub(r"^\s*(?:\(?[A-Z][.)]|option [A-Z][.:)]?)\s+(?=\S)", "", q)  # an option letter prefix: "A. Fava beans"
    q = " ".join(q.strip().strip("\"'`").split())
    if len(re.sub(r"[^A-Za-z0-9]", "", q)) < 3 or is_content_free(q):
        return None
    if _normalized(q) in {_normalized(e) for e in PROMPT_EXAMPLE_QUERIES}:
        return None
    terms = set(key_terms(q, max_words=64).split())
    if any(terms == set(key_terms(e).split()) for e in PROMPT_EXAMPLE_QUERIES):
        # the example up to punctuation, stopwords and word order ("digoxin toxicity, yellow vision and nausea")
        return None
    return " ".join(q.split()[:max_words])


def _normalized(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def dedupe(queries: list[str | None]) -> list[str | None]:
    """Mark a query that repeats an earlier one (ignoring case) as unusable."""
    seen: set[str] = set()
    out: list[str | None] = []
    for q in queries:
        key = q.lower() if q else None
        out.append(None if key is None or key in seen else q)
        if key:
            seen.add(key)
    return out
