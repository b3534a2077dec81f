"""Helpers shared by tests: tiny corpora and JSONL writers."""

from __future__ import annotations

import json
from pathlib import Path

TINY_ROWS = [
    ("p1", "Iron deficiency anemia", "Microcytic hypochromic anemia with low ferritin and high total iron-binding capacity."),
    ("p2", "Vitamin B12 deficiency", "Macrocytic anemia with hypersegmented neutrophils and subacute combined degeneration of the cord."),
    ("p3", "Digoxin toxicity", "Nausea, yellow-green vision and atrial tachycardia with block; worsened by hypokalemia."),
    ("p4", "Graves disease", "Hyperthyroidism with diffuse goiter, exophthalmos and pretibial myxedema from TSH receptor antibodies."),
    ("p5", "Hashimoto thyroiditis", "Hypothyroidism with anti-thyroid peroxidase antibodies and lymphocytic infiltrate with germinal centers."),
    ("p6", "Streptococcus pneumoniae", "Lancet-shaped gram-positive diplococci; the most common cause of community-acquired pneumonia."),
    ("p7", "Myasthenia gravis", "Fatigable ptosis and diplopia from antibodies against the acetylcholine receptor; improves with edrophonium."),
    ("p8", "Lambert-Eaton syndrome", "Proximal weakness improving with repeated use; antibodies to presynaptic calcium channels; small cell carcinoma."),
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def snippet(pid: str, title: str, content: str) -> dict:
    return {"id": pid, "title": title, "content": content, "contents": f"{title}. {content}"}


class SchemaEngine:
    """A deterministic DSPy engine for optimizer tests: it fills any JSON schema DSPy asks for.

    Enum fields get ``answer`` when it is allowed (else their first value), strings a fixed
    query-like text, numbers 1; a request without a schema (a free-text prompt) gets an
    instruction in a fenced block. Every prompt is recorded in ``prompts``.
    """

    supports_response_schema = True
    supported_params = frozenset({"response_format", "temperature", "max_tokens", "top_p", "top_k", "stop", "seed"})

    def __init__(self, answer="A", text="digoxin toxicity yellow vision hypokalemia"):
        self.answer, self.text, self.prompts = answer, text, []

    def _value(self, prop):
        prop = prop or {}
        if "anyOf" in prop:
            prop = next((p for p in prop["anyOf"] if p.get("type") != "null"), prop["anyOf"][0])
        if "enum" in prop:
            return self.answer if self.answer in prop["enum"] else prop["enum"][0]
        kind = prop.get("type")
        if kind == "integer" or kind == "number":
            return 1
        if kind == "boolean":
            return True
        if kind == "array":
            return [self._value(prop.get("items"))]
        if kind == "object":
            return {k: self._value(v) for k, v in (prop.get("properties") or {}).items()}
        return self.text

    def complete(self, request):
        import json as _json

        from dspy.lm15 import Message, Response, TextPart, Usage

        prompt = "\n".join(m.text or "" for m in request.messages)
        self.prompts.append(prompt)
        rf = request.config.response_format or {}
        schema = rf.get("schema") if isinstance(rf, dict) else None
        if schema:
            text = _json.dumps({k: self._value(v) for k, v in (schema.get("properties") or {}).items()})
        else:
            text = "```\nRead the question, weigh the findings that separate the options, then answer.\n```"
        return Response(id=None, model="schema", message=Message.assistant([TextPart(text)]), finish_reason="stop",
                        usage=Usage(input_tokens=len(prompt) // 4, output_tokens=len(text) // 4, total_tokens=0))

    def stream(self, request):
        raise NotImplementedError

    def close(self):
        pass


def schema_lm(answer="A", **kwargs):
    """A ``dspy.LM`` over :class:`SchemaEngine` (no cache, so every call reaches the engine)."""
    import uuid

    import dspy

    engine = SchemaEngine(answer, **kwargs)
    lm = dspy.LM(f"schema/{uuid.uuid4().hex}", engine=engine, temperature=0.0, max_tokens=200, cache=False)
    lm.schema_engine = engine
    return lm
