"""What one evaluation is (:class:`EvalSpec`) and how its inputs are checked and opened before any LM call:
method and options, a saved program, questions, index (:func:`resolve`). ``hcqr ask`` makes the same checks
through :func:`resolve_method`, :func:`check_retrieval_inputs` and :func:`build_program`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy

from hcqr_dspy import __version__, data_sources
from hcqr_dspy.data import load_questions, select
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.fingerprints import prompt_fingerprint, question_fingerprint
from hcqr_dspy.lm import DEFAULT_N_CTX, parse_lm_spec
from hcqr_dspy.lm.adapter import response_format_dialect
from hcqr_dspy.lm.model_file import gguf_sha256
from hcqr_dspy.optimize.answer_step import adopt_answer_step
from hcqr_dspy.optimize.saved import SavedProgram, refuse_overlap
from hcqr_dspy.programs.method_registry import PROGRAMS, make_program
from hcqr_dspy.programs.program_base import accepted_options
from hcqr_dspy.retrieval import load_index, read_manifest
from hcqr_dspy.tracking.model_links import resolve_model_uri
from hcqr_dspy.tracking.store import tracking_uri
from hcqr_dspy.workflows.programs import resolve_saved_program


@dataclass
class EvalSpec:
    """Everything that defines one evaluation (it becomes the run folder's config).

    Attributes:
        method: Registered method name (``cot``, ``simple_rag``, ``hcqr``).
        dataset: MIRAGE-format file, saved Hugging Face dataset (``FOLDER[:SPLIT]``), MLflow evaluation dataset
            (``mlflow:NAME``, ``mlflow:ID``, ``mlflow:REF@STORE``) or hub name (:mod:`hcqr_dspy.data_sources`);
            :func:`resolve` fills in the store of an ``mlflow:`` dataset given without one.
        index: Index folder (``None`` only for methods without retrieval).
        lm: ``--lm`` spec.
        limit / seed / ids: Question selection (see :func:`hcqr_dspy.data.select`).
        program_options: Method settings (``budget``, ``k_per_query``, ``fusion`` ...); only
            options the method's constructor takes are accepted (others are refused, naming
            the method), and absent ones take the method's documented defaults.
        temperature / max_tokens / n_ctx: LM settings (temperature 0 as in the reference setup).
        api_base / api_key_env: LiteLLM endpoint and the name of its key variable.
        num_threads: Questions in flight.
        run_dir: Run folder; derived from the spec when ``None``.
        program: A saved (e.g. compiled) program to run instead of a fresh
            one: a folder from ``hcqr compile`` or ``runs:/<MLflow run id>``; its
            method and options come from the program (``method`` may be
            ``None``; given, it must match), so ``program_options`` must be empty.
        answer_step: A saved program whose answer step (instructions and demos) the fresh method
            answers with (:func:`hcqr_dspy.optimize.answer_step.adopt_answer_step`); not with ``program``.
            Recorded in the config under ``answer_step``.
        search_options: Search-time options of a dense index (``nprobe``,
            ``efSearch``, ``k_factor``); recorded in the config under ``index``.
        encoder_backend: What embeds the queries (``torch``, ``onnx``,
            ``onnx-int8``, ``openvino``, ``openvino-bf16``; ``None`` = torch); recorded in the
            config under ``index``.
        labelled: The questions must have gold answers (``hcqr eval``). ``False``
            (``hcqr predict``) accepts questions without one; they are answered, not
            scored, and the config records ``questions.labelled: false``.
    """

    method: str | None
    dataset: str
    index: str | None = None
    lm: str = "local"
    limit: int | None = None
    seed: int = 0
    ids: Sequence[str] | None = None
    program_options: dict[str, Any] = field(default_factory=dict)
    temperature: float = 0.0
    max_tokens: int = 1024
    n_ctx: int = DEFAULT_N_CTX
    api_base: str | None = None
    api_key_env: str | None = None
    num_threads: int = 1
    run_dir: str | None = None
    program: str | None = None
    answer_step: str | None = None
    search_options: dict[str, int] = field(default_factory=dict)
    encoder_backend: str | None = None
    labelled: bool = True


def check_program_options(method: str, options: dict[str, Any], flags: bool = True) -> None:
    """Refuse options a method does not take (one line naming the method and what it takes).

    Args:
        method: A registered method.
        options: The options asked for.
        flags: Name them as CLI flags (``--k-per-query``) rather than keys.

    Raises:
        HCQRError: an option the method's constructor does not accept.
    """
    valid = accepted_options(PROGRAMS[method])
    bad = sorted(set(options) - valid)
    if bad:
        name = (lambda k: "--" + k.replace("_", "-")) if flags else str
        raise HCQRError(
            f"{', '.join(map(name, bad))} does not apply to method {method!r} "
            f"(it takes: {', '.join(map(name, sorted(valid - {'max_context_tokens'}))) or 'none'})"
        )


def resolve_method(
    method: str | None, program: str | None, program_options: dict[str, Any], mlflow_dir: str | Path | None = None
) -> tuple[str, SavedProgram | None]:
    """The method to run, checked with its options; a saved program's own method when ``program`` is given.

    Args:
        method: The method asked for (``None`` with ``program``: the saved program's).
        program: A saved program (a folder from ``hcqr compile``, ``runs:/``, ``models:/``) or ``None``.
        program_options: The method options given (none are allowed with a saved program).
        mlflow_dir: The MLflow store of ``runs:/`` and ``models:/`` programs.

    Returns:
        The method, and the saved program as read, once for the command
        (:func:`~hcqr_dspy.workflows.programs.resolve_saved_program`; ``None`` without one).

    Raises:
        HCQRError: an unknown method, an option the method does not take, a saved program of another
            method or of a newer format, or given options of its own.
    """
    saved = None
    if program:
        saved = resolve_saved_program(program, mlflow_dir)
        if method and method != saved.method:
            raise HCQRError(f"{program} is a saved {saved.method!r} program, not {method!r}")
        method = saved.method
    if method not in PROGRAMS:
        raise HCQRError(f"unknown method {method!r}; choose one of {', '.join(PROGRAMS)}")
    if saved and program_options:
        raise HCQRError(
            f"{program} is a saved program: its options come with it; drop "
            + ", ".join("--" + k.replace("_", "-") for k in sorted(program_options))
        )
    check_program_options(method, program_options)
    return method, saved


def build_program(
    method: str, retriever: Any, program_options: dict[str, Any], saved: SavedProgram | None = None
) -> tuple[Any, dict[str, Any] | None]:
    """A fresh ``method`` program over ``retriever``, or the ``saved`` program (as :func:`resolve_method` read it).

    Returns:
        The program and the saved program's metadata (``None`` for a fresh one).

    Raises:
        HCQRError: option values the method's constructor refuses, or a saved program that does not load.
    """
    if saved is not None:
        return saved.build(retriever), saved.described()
    try:
        return make_program(method, retriever, **program_options), None
    except ValueError as exc:
        raise HCQRError(f"method {method!r}: {exc}") from None


def resolve(spec: EvalSpec, mlflow_dir: str | Path | None = None) -> tuple[dict[str, Any], list[dspy.Example], Any]:
    """Check every input before any LM call: method, options, LM spec, questions, index.

    A saved program (``spec.program``) fills ``spec.method``; a ``runs:/``
    program is fetched from the MLflow store ``mlflow_dir``, and so is an ``mlflow:`` dataset
    given without a store (``spec.dataset`` then names the store: ``mlflow:REF@<tracking URI>``).

    Returns:
        The run folder's config, the selected questions and the program.

    Raises:
        HCQRError: unknown method or LM spec, an option the method does not
            take, malformed questions, a missing or mismatched index; a saved
            program of another method, of a newer format, or compiled on some of
            these questions, or given options of its own.
    """
    spec.method, saved = resolve_method(spec.method, spec.program, spec.program_options, mlflow_dir)
    answer = None
    if spec.answer_step:
        if spec.program:
            raise HCQRError(f"{spec.program} is a saved program with its own answer step: drop --answer-step")
        answer = resolve_saved_program(spec.answer_step, mlflow_dir)
    lm_cfg = parse_lm_spec(spec.lm, api_base=spec.api_base, api_key_env=spec.api_key_env)
    spec.dataset = data_sources.with_store(spec.dataset, tracking_uri(mlflow_dir))
    questions = select(
        load_questions(spec.dataset, labelled=spec.labelled), limit=spec.limit, seed=spec.seed, ids=spec.ids
    )
    if saved and saved.train:
        refuse_overlap(saved.train, questions, dataset_name(spec.dataset), f"saved program {spec.program}")
    if answer and answer.train:
        refuse_overlap(answer.train, questions, dataset_name(spec.dataset), f"answer step {spec.answer_step}")
    retriever, index_info = open_index(spec.method, spec.index, spec.search_options, spec.encoder_backend)
    program, _ = build_program(spec.method, retriever, spec.program_options, saved)
    if answer is not None:
        adopt_answer_step(program, answer)
    config = {
        "method": spec.method,
        "program": program.settings(),
        "prompts_sha256": prompt_fingerprint(program),  # what each stage's LM call is made of
        "saved_program": saved_program_record(saved) if saved else None,
        # recorded only when given: absent is no answer step (run_config.without_nones)
        **({"answer_step": saved_program_record(answer)} if answer else {}),
        "dataset": data_sources.place(spec.dataset),
        "questions": {
            **question_fingerprint(questions),
            "limit": spec.limit,
            "seed": spec.seed,
            **({} if spec.labelled else {"labelled": False}),
        },
        "index": index_info,
        "lm": {
            **lm_cfg.params(),
            # a gguf: file is the bytes at its path: another file put there is another LM
            **({"sha256": gguf_sha256(lm_cfg.path)} if lm_cfg.kind == "gguf" and Path(lm_cfg.path).is_file() else {}),
            "temperature": spec.temperature,
            "max_tokens": spec.max_tokens,
            "n_ctx": spec.n_ctx,
            # how a remote LM is sent the output schema (hcqr_dspy.lm.adapter); in-process engines take it as a grammar
            "response_format": response_format_dialect() if lm_cfg.kind == "litellm" else None,
        },
        "adapter": "JSONAdapter",
        "hcqr_dspy_version": __version__,
    }
    return config, questions, program


def check_retrieval_inputs(
    method: str, index: str | None, search_options: dict[str, int] | None = None, encoder_backend: str | None = None
) -> bool:
    """Whether ``method`` retrieves; refuse an index it lacks, or search options it cannot use.

    Raises:
        HCQRError: a retrieval method without an index, or search options or an encoder backend
            for a method without retrieval.
    """
    if not PROGRAMS[method].uses_retrieval:
        if search_options:
            raise HCQRError(
                f"method {method!r} retrieves nothing: search options ({', '.join(search_options)}) do not apply"
            )
        if encoder_backend not in (None, "torch"):
            raise HCQRError(f"method {method!r} retrieves nothing: --encoder-backend does not apply")
        return False
    if not index:
        raise HCQRError(f"method {method!r} needs --index (build one with `hcqr index`)")
    return True


def open_index(
    method: str, index: str | None, search_options: dict[str, int] | None = None, encoder_backend: str | None = None
) -> tuple[Any, dict[str, Any] | None]:
    """The retriever a method needs and the index record run folders keep; ``(None, None)`` without retrieval.

    ``search_options`` (``nprobe``, ``efSearch``, ``k_factor``) are applied to the index
    and recorded with it, and so is ``encoder_backend`` (what embeds the
    queries); a method without retrieval refuses both (:func:`check_retrieval_inputs`).

    Raises:
        HCQRError: a retrieval method without an index, an index that does
            not load, or search options or an encoder backend without an index.
    """
    if not check_retrieval_inputs(method, index, search_options, encoder_backend):
        return None, None
    retriever = load_index(index, search_options=search_options, encoder_backend=encoder_backend)
    runtimes = {
        p.encoder.spec.query_runtime
        for p in [retriever, *getattr(retriever, "retrievers", [])]
        if getattr(p, "encoder", None) is not None
    }
    manifest = read_manifest(index, verify_files=False)
    dense = manifest if manifest["retriever"] == "dense" else None
    return retriever, {
        "path": str(Path(index).resolve()),
        "retriever": manifest["retriever"],
        "encoder": manifest.get("encoder"),
        "corpus_source": manifest["corpus"]["source"],
        "corpus_fingerprint": manifest["corpus"]["fingerprint"],
        "corpus_count": manifest["corpus"]["count"],
        **({"vector_index": dense["vector_index"].get("factory") or dense["vector_index"]["backend"]} if dense else {}),
        **({"search_options": dict(retriever.search_options)} if retriever.search_options else {}),
        # recorded only when not the default torch: absent is torch
        **({"encoder_backend": next(iter(runtimes))} if runtimes - {"torch"} else {}),
    }


def dataset_name(dataset: str) -> str:
    """A dataset's name: the file stem (``medqa`` for ``.../medqa.json``), a saved dataset's folder name, an MLflow
    dataset's NAME or ID, or the hub name (:func:`hcqr_dspy.data_sources.label`)."""
    return data_sources.label(dataset)


def saved_program_record(saved: SavedProgram) -> dict[str, Any]:
    """What a run folder records about the ``saved`` program it ran: where, its optimizer, recipe and compile ``seed``
    (``meta.json``'s ``recipe.seed``: replicate compiles of one recipe differ in it; ``None`` for a program no
    recipe compiled), its training set, the SHA-256 of its ``program.json`` (instructions and demos edited by
    hand after the compile change it), and for a ``models:/`` URI the registered version and LoggedModel it
    resolved to (:func:`hcqr_dspy.tracking.model_links.resolve_model_uri`)."""
    source, meta = saved.source, saved.meta
    recipe = meta.get("recipe") or {}
    train = meta.get("train") or {}
    return {
        "source": source,
        "folder": str(saved.folder.resolve()),
        "optimizer": meta.get("optimizer"),
        "recipe": recipe.get("name") if isinstance(recipe, dict) else recipe,
        "seed": recipe.get("seed") if isinstance(recipe, dict) else None,
        "created": meta.get("created"),
        "compile_run_id": meta.get("mlflow_run_id"),
        "train_dataset": train.get("dataset"),
        "train_count": train.get("train_count", len(train.get("ids") or [])),
        "val_count": train.get("val_count", 0),
        "program_sha256": saved.state_sha256,  # the bytes read and checked once, not the file read again
        # a models:/ URI as it resolved now: an alias moved later cannot change what this run ran
        **({"model": resolve_model_uri(source)} if source.startswith("models:/") else {}),
    }
