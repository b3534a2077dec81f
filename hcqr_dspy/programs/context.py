"""The answer step's context: MedRAG's document format, cut to a token budget.

Passages are shown as ``Document [i] (Title: t) text`` (:func:`format_document`), whole from the top
while they fit the budget, the one that crosses it cut short (:func:`fit_documents`); the budget itself
is the program's (:meth:`hcqr_dspy.programs.program_base.MCQProgram.context_budget`). Few-shot demos keep a short
context (:func:`trimmed_demos`). Run rows record what was shown (:func:`passage_records`), and
:func:`shown_documents` rebuilds it for the DUR judge.
Tokens are counted by :func:`hcqr_dspy.lm.count_tokens` for the LM given.
"""

from __future__ import annotations

from typing import Any

from hcqr_dspy.lm import count_tokens
from hcqr_dspy.retrieval.fusion import FusedPassage
from hcqr_dspy.retrieval.retriever_base import Retriever

DEFAULT_MAX_CONTEXT_TOKENS = 6000
# Tokens of DSPy's JSONAdapter template around the answer step's inputs
# (field list, instructions, output format, chat markup): 320 with the
# Qwen2.5 tokenizer for empty inputs (dspy 3.4.1), plus margin for chat
# markup and tokenizer differences.
PROMPT_OVERHEAD_TOKENS = 600
# JSON field names and chat turns around one few-shot demo (a user and an assistant message).
DEMO_OVERHEAD_TOKENS = 60
# Context kept in a few-shot demo of the answer step: about three passages. A bootstrapped demo carries its
# question's whole fused context (15 passages, 3-4k tokens); two of them and the live context would not fit 8k.
DEMO_CONTEXT_TOKENS = 600


def trim_context(context: str, max_tokens: int, lm=None) -> str:
    """A MedRAG-format context (one ``Document [i] ...`` per line) cut to ``max_tokens``: whole documents
    from the top, or the head of the first when even it is longer. Tokens counted by
    :func:`hcqr_dspy.lm.count_tokens` for ``lm``."""
    if count_tokens(lm, context) <= max_tokens:
        return context
    kept, used = [], 0
    for line in context.split("\n"):
        n = count_tokens(lm, line)
        if used + n > max_tokens:
            break
        kept.append(line)
        used += n
    if not kept:
        first = context.split("\n")[0]
        kept = [first[: max(0, int(len(first) * max_tokens / max(1, count_tokens(lm, first))))]]
    return "\n".join(kept)


def trimmed_demos(demos: list[Any], max_tokens: int, lm=None) -> list[Any]:
    """Copies of few-shot demos whose ``context`` is cut by :func:`trim_context` (others as they are)."""
    out = []
    for demo in demos:
        context = demo.get("context") if hasattr(demo, "get") else None
        if isinstance(context, str) and count_tokens(lm, context) > max_tokens:
            demo = demo.copy() if hasattr(demo, "copy") else dict(demo)
            demo["context"] = trim_context(context, max_tokens, lm)
        out.append(demo)
    return out


def demo_text(demos: list[Any]) -> str:
    """The field values of few-shot demos joined: what they add to a prompt, for token counting."""
    values = []
    for demo in demos:
        items = demo.items() if hasattr(demo, "items") else []
        values.extend(str(v) for k, v in items if k != "augmented" and v is not None)
    return "\n".join(values)


def format_document(i: int, title: str, content: str, max_chars: int | None = None) -> str:
    """One passage as the answer step and the DUR judge see it: MedRAG's ``Document [i] (Title: t) text``.

    Args:
        i: 1-based position in the context.
        title, content: The passage.
        max_chars: Keep only the first ``max_chars`` characters of ``content`` (a passage cut by the
            context's token budget); ``None`` keeps it whole.
    """
    text = content if max_chars is None else content[:max_chars]
    return f"Document [{i}] (Title: {title}) {text}"


def passage_records(
    retriever: Retriever, fused: list[FusedPassage], shown_chars: dict[int, int] | None = None
) -> list[dict[str, Any]]:
    """JSON-able description of fused passages (id, title, score, provenance).

    Args:
        retriever: Resolves ids to titles.
        fused: The passages, in context order.
        shown_chars: ``{position: characters of content shown}`` for passages cut short by the
            token budget (recorded as ``shown_chars``).
    """
    records = []
    for i, f in enumerate(fused):
        record = {
            "id": f.passage_id,
            "title": retriever.get(f.passage_id).title,
            "score": round(f.score, 6),
            "queries": list(f.queries),
            "ranks": list(f.ranks),
        }
        if shown_chars and i in shown_chars:
            record["shown_chars"] = shown_chars[i]
        records.append(record)
    return records


def shown_documents(retriever: Retriever, passages: list[dict[str, Any]]) -> list[str]:
    """The documents of a run row's ``passages`` exactly as the answer step saw them
    (:func:`format_document`, a cut passage cut at its ``shown_chars``)."""
    docs = []
    for i, record in enumerate(passages, start=1):
        p = retriever.get(record["id"])
        docs.append(format_document(i, p.title, p.content, record.get("shown_chars")))
    return docs


def fit_documents(passages: list[Any], limit: int, lm=None) -> tuple[str, dict[str, int], dict[int, int]]:
    """Passages (with ``title`` and ``content``) as :func:`format_document` lines, cut to ``limit`` tokens.

    Whole passages are kept from the top while they fit; the passage that
    crosses the budget keeps the head of its text when more than 50 tokens
    are left, and the rest are dropped.

    Returns:
        The context string; the cut (``passages_kept``, ``passages_dropped``,
        ``tokens_before``, ``tokens_after``, ``tokens_dropped``; 0 dropped when
        nothing was cut); and ``{position: characters of content shown}`` for
        a passage cut short.
    """
    docs = [format_document(i, p.title, p.content) for i, p in enumerate(passages, start=1)]
    counts = [count_tokens(lm, d) for d in docs]
    total = sum(counts)
    kept, used, partial = [], 0, {}
    for pos, (p, doc, n) in enumerate(zip(passages, docs, counts)):
        if used + n <= limit:
            kept.append(doc)
            used += n
            continue
        room = limit - used
        if room > 50:  # keep the head of the passage that crosses the budget
            chars = int(len(p.content) * room / n)
            doc = format_document(pos + 1, p.title, p.content, chars)
            while chars > 0 and count_tokens(lm, doc) > room:
                chars = int(chars * 0.9)
                doc = format_document(pos + 1, p.title, p.content, chars)
            kept.append(doc)
            used += count_tokens(lm, doc)
            partial[pos] = chars
        break
    cut = {
        "passages_kept": len(kept),
        "passages_dropped": len(docs) - len(kept),
        "tokens_before": total,
        "tokens_after": used,
        "tokens_dropped": max(0, total - used),
    }
    return "\n".join(kept), cut, partial
