"""Where a run's records were made: the machine, library versions and LM engine of each session.

A run folder is written by one or more sessions (``hcqr eval`` started,
stopped, resumed later, possibly on another machine; ``hcqr judge`` likewise).
At temperature 0 an LM need not give the same reply on another machine or
build, so rows from different sessions are not guaranteed to be what one
session would have written. Each session therefore appends one record to the
folder's ``sessions.jsonl`` (:meth:`hcqr_dspy.evaluation.run_folder.RunFolder.record_session`)
and ``hcqr compare`` says from how many machines a run's rows came.

Nothing here changes a run's configuration (``config.json``): a run may be
resumed on another machine, and that is recorded, not refused.
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import UTC, datetime
from typing import Any

from hcqr_dspy.lm import LlamaCppEngine
from hcqr_dspy.lm.model_file import gguf_sha256
from hcqr_dspy.lm.reply_setup import lm_settings, lm_setup, package_versions, response_cache

# Distributions whose versions can change a run's replies or retrieval (names as pip knows them).
PACKAGES = (
    "hcqr-dspy",
    "dspy",
    "litellm",
    "llama_cpp_python",
    "torch",
    "sentence-transformers",
    "transformers",
    "faiss-cpu",
    "bm25s",
    "pymilvus",
    "numpy",
)
# The fields of a session record in ``sessions.jsonl`` (:func:`session_record` and its place in the folder) and
# their JSON types.
SESSION_FIELDS: dict[str, type | tuple[type, ...]] = {
    "session": int,
    "command": str,
    "started": str,
    "machine": dict,
    "packages": dict,
    "engine": (dict, type(None)),
    "endpoint": (dict, type(None)),  # absent from records written before it was recorded
    # absent from records written before they were recorded: the LM's request settings, the fingerprint of its setup
    # (hcqr_dspy.lm.reply_setup, which the rows' cached replies name) and the response cache it used
    "lm": (dict, type(None)),
    "reply_setup": (str, type(None)),
    "response_cache": (dict, type(None)),
    # absent from records written before it was recorded, and from sessions that answer no question (judge, rescore)
    "questions_in_flight": (int, type(None)),
    "predictions_before": int,
    "judgments_before": int,
}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`); ``"unknown"`` if neither
    says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def engine_record(lm: Any) -> dict[str, Any] | None:
    """The in-process llama.cpp engine behind ``lm``: its context window, its settings
    (:class:`~hcqr_dspy.lm.engine_settings.EngineSettings`: threads, batches, flash attention, repacking),
    llama.cpp's ``llama_print_system_info`` (the CPU features the build uses) and the model file it loaded (its
    name and the SHA-256 of its bytes, :func:`~hcqr_dspy.lm.model_file.gguf_sha256`); ``None`` for an LM served
    elsewhere (an API endpoint, DummyLM)."""
    engine = getattr(lm, "engine", None)
    if not isinstance(engine, LlamaCppEngine):
        return None
    return {
        **engine.settings.record(),
        "n_ctx": engine.n_ctx,
        "build": engine.build,
        "system_info": engine.system_info,
        "model_file": engine.model_path.name,
        "model_sha256": gguf_sha256(engine.model_path),
    }


def session_record(command: str, lm: Any = None, questions_in_flight: int | None = None) -> dict[str, Any]:
    """One session's record (without its place in the folder, which the folder adds).

    Args:
        command: What wrote the records (``"eval"``, ``"judge"``).
        lm: The session's ``dspy.LM`` (its llama.cpp engine, if any, is described).
        questions_in_flight: How many questions the session answers at once (``hcqr eval --threads``); ``None``
            for a session that answers none. A server batches concurrent requests, and vLLM's replies depend on
            the batch (vLLM's documentation, "Reproducibility": not reproducible by default, online only with
            batch invariance); an in-process engine resumes each prompt from the one before it, whose order the
            concurrency sets.

    Returns:
        ``{"command", "started" (UTC, ISO 8601), "machine": {"cpu", "cores", "arch", "os", "python"},
        "packages": {name: version}, "engine": {...} or None, "endpoint": {...} or None, "lm": {...} or None,
        "reply_setup": str or None, "response_cache": {...} or None, "questions_in_flight": int or None}``: the
        engine of an in-process model, the model card an OpenAI-compatible server listed when the LM was built
        (:func:`~hcqr_dspy.lm.endpoint_card.endpoint_card`), the LM's temperature, max tokens and whether it caches
        (:func:`~hcqr_dspy.lm.reply_setup.lm_settings`), the fingerprint of its setup that its cached replies carry
        (:func:`~hcqr_dspy.lm.reply_setup.lm_setup`) and the response cache's folder
        (:func:`~hcqr_dspy.lm.reply_setup.response_cache`), those three ``None`` without an LM; and
        ``questions_in_flight``.
    """
    return {
        "command": command,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "arch": platform.machine(),
            "os": platform.platform(),
            "python": sys.version.split()[0],
        },
        "packages": package_versions(PACKAGES),
        "engine": engine_record(lm),
        "endpoint": getattr(lm, "hcqr_endpoint_card", None),
        "lm": lm_settings(lm) if lm is not None else None,
        "reply_setup": lm_setup(lm)["fingerprint"] if lm is not None else None,
        "response_cache": response_cache(lm) if lm is not None else None,
        "questions_in_flight": questions_in_flight,
    }


def malformed_fields(record: dict[str, Any]) -> list[str]:
    """The fields of :data:`SESSION_FIELDS` that a session record lacks or holds with another JSON type."""
    return [
        name
        for name, kinds in SESSION_FIELDS.items()
        if not isinstance(record.get(name), kinds) or isinstance(record.get(name), bool)
    ]


def machine_key(record: dict[str, Any]) -> str:
    """What tells two sessions' machines apart for a report: CPU model and cores, the llama.cpp build's CPU
    features, threads and the settings that can change a reply (where the record holds them), the model card an
    OpenAI-compatible server listed (not its address: a server moved to another port is the same stack), and the
    versions of the LM stack (``dspy``, ``litellm``, ``llama_cpp_python``)."""
    machine = record.get("machine") or {}
    engine = record.get("engine") or {}
    packages = record.get("packages") or {}
    parts = [f"{machine.get('cpu', '?')} ({machine.get('cores', '?')} cores)"]
    if engine:
        parts.append(
            f"llama.cpp {packages.get('llama_cpp_python', '?')}, {engine.get('n_threads', '?')} threads, "
            + (
                f"ubatch {engine['n_ubatch']}, flash_attn {engine.get('flash_attn')}, "
                f"extra_bufts {engine.get('use_extra_bufts')}, "
                if "n_ubatch" in engine
                else ""
            )
            + f"[{engine.get('system_info', '?')}]"
        )
    endpoint = record.get("endpoint") or {}
    if endpoint:
        card = {k: v for k, v in endpoint.items() if k != "url"}
        parts.append("server model " + ", ".join(f"{k} {v}" for k, v in card.items()))
    parts.append(f"dspy {packages.get('dspy', '?')}, litellm {packages.get('litellm', '?')}")
    return "; ".join(parts)
