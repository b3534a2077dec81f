"""What identifies a question set (:func:`question_fingerprint`): recorded in a run's ``config.json`` so that runs
over the same questions can be recognised, and a resumed or reloaded run checked against its questions."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any


def question_fingerprint(examples: Sequence[Any]) -> dict[str, Any]:
    """What identifies a question set: its ids and its content.

    Returns:
        ``count``; ``ids_sha256`` (SHA-256 of the ids, one per line, in order);
        ``content_sha256`` (SHA-256 of each question's id, text, options and
        answer as canonical JSON, one per line, in order): two runs over files
        that reuse ids for other questions differ here.
    """
    ids = [str(e.qid) for e in examples]
    content = "\n".join(
        json.dumps([str(e.qid), e.question, dict(e.options), e.answer], sort_keys=True, ensure_ascii=False)
        for e in examples
    )
    return {
        "count": len(ids),
        "ids_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest(),
        "content_sha256": hashlib.sha256(content.encode("utf-8")).hexdigest(),
    }


def prompt_fingerprint(program: Any) -> str:
    """SHA-256 of what a program's LM calls are made of, stage by stage: each predictor's (``named_predictors()``)
    signature instructions, fields (name, input or output, prefix, description, in order) and demos. Two runs
    whose programs differ here send other prompts: a signature reworded by an upgrade or an edit of the code, or
    a saved program's instructions or demos changed.
    """
    stages = {}
    for name, predictor in program.named_predictors():
        signature = predictor.signature
        fields = [
            [key, *(str((field.json_schema_extra or {}).get(k, "")) for k in ("__dspy_field_type", "prefix", "desc"))]
            for key, field in signature.fields.items()
        ]
        demos = [dict(demo) for demo in predictor.demos]
        stages[name] = {"instructions": signature.instructions, "fields": fields, "demos": demos}
    text = json.dumps(stages, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
