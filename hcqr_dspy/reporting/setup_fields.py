"""What a run's setup consists of, field by field: those its ``config.json`` records (:func:`run_fields`) and those a
session or a cached reply's record holds (:func:`lm_fields`), as :mod:`hcqr_dspy.reporting.setups` compares them."""

from __future__ import annotations

import json
import re
from typing import Any

# Program options that are retrieval settings (compared between runs that retrieve).
RETRIEVAL_SETTINGS = ("budget", "k_per_query", "fusion", "max_context_tokens")
# Where a run's index lies, not what it is (left out).
INDEX_PLACES = ("path", "corpus_source")
THREADS = "threads (flash attention on)"
IN_FLIGHT = "questions in flight"
COMPILE_SETUP = "compile setup"
# A saved program's compile setup that was not recorded (saved before programs recorded it), or not of its shape.
NOT_RECORDED = "not recorded"
MALFORMED = "malformed record"
# The order fields are listed in (an index's fields come where "index" is).
FIELD_ORDER = (
    *("LM", "model", "model file", "endpoint", "endpoint model card", "endpoint server version", "temperature"),
    *("max tokens", "n_ctx", "response format", "adapter", "llama.cpp build", "llama.cpp CPU features", "n_batch"),
    *("n_ubatch", "flash_attn", "use_extra_bufts", THREADS, IN_FLIGHT, "dspy", "llama-cpp-python", "litellm"),
    *("questions", "question ids", "seed", "limit", "index", *RETRIEVAL_SETTINGS, COMPILE_SETUP),
)


def field_rank(name: str) -> tuple[int, str]:
    return (FIELD_ORDER.index("index"), name) if name.startswith("index ") else (FIELD_ORDER.index(name), "")


def setup_value(value: Any) -> Any:
    """A field's value as compared and shown: a SHA-256 cut to 12 digits, a mapping as compact JSON."""
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return value


def shown_value(value: Any) -> str:
    return "–" if value is None else ("on" if value else "off") if isinstance(value, bool) else str(value)


def run_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a run's setup that its ``config.json`` records (``None``: not recorded or not applicable)."""
    lm = config.get("lm") or {}
    questions = config.get("questions") or {}
    place = {"litellm": "provider's default endpoint", "packaged": "in-process", "gguf": "in-process"}
    fields = {
        "LM": lm.get("spec"),
        "model": lm.get("model"),
        "endpoint": lm.get("api_base") or place.get(lm.get("kind")),
        "temperature": lm.get("temperature"),
        "max tokens": lm.get("max_tokens"),
        "n_ctx": lm.get("n_ctx"),
        "response format": lm.get("response_format"),
        "adapter": config.get("adapter"),
        "questions": questions.get("content_sha256"),
        "question ids": questions.get("ids_sha256"),
        "seed": questions.get("seed"),
        "limit": questions.get("limit"),
    }
    index = config.get("index")
    if isinstance(index, dict):  # a method that retrieves
        fields.update({f"index {k}": v for k, v in sorted(index.items()) if k not in INDEX_PLACES})
        program = config.get("program") or {}
        fields.update({k: program.get(k) for k in RETRIEVAL_SETTINGS})
    return {k: setup_value(v) for k, v in fields.items()}


def lm_fields(engine: Any, card: Any, packages: Any, in_flight: Any = None) -> dict[str, Any]:
    """The fields of a setup that a session (or a cached reply's record) holds: the in-process engine's (model file,
    build, CPU features, batches, flash attention, repacking, threads with flash attention on), an endpoint's model
    card (without its address) and the version its server reports
    (:func:`~hcqr_dspy.lm.endpoint_card.server_version`), the library versions that decide replies there, and how
    many questions the session answered at once (``in_flight``; a cached reply's record and a session before it was
    recorded have none)."""
    engine = engine if isinstance(engine, dict) else {}
    packages = packages if isinstance(packages, dict) else {}
    fields: dict[str, Any] = {}
    if engine:
        fields.update(
            {
                "model file": engine.get("model_sha256"),
                "llama.cpp build": engine.get("build"),
                "llama.cpp CPU features": _features(engine.get("system_info")),
                **{k: engine.get(k) for k in ("n_batch", "n_ubatch", "flash_attn", "use_extra_bufts")},
                THREADS: engine.get("n_threads") if engine.get("flash_attn") else None,
                "llama-cpp-python": packages.get("llama_cpp_python"),
            }
        )
    else:
        fields["litellm"] = packages.get("litellm")
    if isinstance(card, dict) and card:
        own = ("url", "api_base", "server_version")  # the address, and the server's version (a field of its own)
        shown = {k: v for k, v in sorted(card.items()) if k not in own and v is not None}
        fields["endpoint model card"] = ", ".join(f"{k} {v}" for k, v in shown.items())
        fields["endpoint server version"] = card.get("server_version")
    fields["dspy"] = packages.get("dspy")
    fields[IN_FLIGHT] = in_flight if isinstance(in_flight, int) and not isinstance(in_flight, bool) else None
    return {k: setup_value(v) for k, v in fields.items() if v is not None}


def _features(system_info: Any) -> str | None:
    """The CPU features a llama.cpp build uses, from ``llama_print_system_info`` (``AVX2 = 1 | ...``): those on."""
    if not isinstance(system_info, str):
        return None
    return " ".join(re.findall(r"(\w+) = 1\b", system_info)) or system_info


def compile_setup_field(meta: Any) -> str | None:
    """A saved program's compile setup as compared between compiled runs: the reply-setup fingerprint of the LM its
    compile ran (``meta.json``'s ``compile_setup.session.reply_setup``, :func:`hcqr_dspy.lm.reply_setup.lm_setup`),
    followed by ``+ cached <fingerprint>`` for each other setup under which replies DSPy's cache served the compile
    were made (``unrecorded``: a reply cached without a record); :data:`NOT_RECORDED` where the program records
    none (compiled before programs recorded it), :data:`MALFORMED` where its record is not of that shape (edited by
    hand), ``None`` for a ``meta.json`` that could not be read."""
    if not isinstance(meta, dict):
        return None
    if "compile_setup" not in meta or meta["compile_setup"] is None:
        return NOT_RECORDED
    setup = meta["compile_setup"]
    session = setup.get("session") if isinstance(setup, dict) else None
    own = session.get("reply_setup") if isinstance(session, dict) else None
    cached = setup.get("cached_setups", []) if isinstance(setup, dict) else None
    if not isinstance(own, str) or not isinstance(cached, list):
        return MALFORMED
    others = []
    for entry in cached:
        fingerprint = entry.get("setup") if isinstance(entry, dict) else None
        if not isinstance(fingerprint, str):
            return MALFORMED
        if fingerprint != own:
            others.append(fingerprint)
    return " ".join([own, *(f"+ cached {o}" for o in dict.fromkeys(others))])
