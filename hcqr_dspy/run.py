"""One evaluation end to end: resolve LM, index, questions and program; run;
track in MLflow. Shared by ``hcqr eval``, ``hcqr demo`` and experiments."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import dspy

from hcqr_dspy import __version__
from hcqr_dspy.data import load_questions, select
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluate import EvalResult, evaluate
from hcqr_dspy.lm import DEFAULT_N_CTX, build_lm, check_lm, parse_lm_spec
from hcqr_dspy.programs import PROGRAMS, accepted_options, make_program
from hcqr_dspy.retrieval import load_index, read_manifest
from hcqr_dspy.run_folder import RunFolder, question_fingerprint

DEFAULT_RUNS = Path("runs")


@dataclass
class EvalSpec:
    """Everything that defines one evaluation (it becomes the run's config).

    Attributes:
        method: Registered method name (``cot``, ``simple_rag``, ``hcqr``).
        dataset: MIRAGE-format file or hub name.
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
            one: a folder from ``hcqr compile`` or ``runs:/<run_id>``; its
            method and options come from the program (``method`` may be
            ``None``; given, it must match), so ``program_options`` must be empty.
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
    search_options: dict[str, int] = field(default_factory=dict)
    encoder_backend: str | None = None
    labelled: bool = True


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60]


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
        raise HCQRError(f"{', '.join(map(name, bad))} does not apply to method {method!r} "
                        f"(it takes: {', '.join(map(name, sorted(valid - {'max_context_tokens'}))) or 'none'})")


def resolve(spec: EvalSpec, mlflow_dir: str | Path | None = None) -> tuple[dict[str, Any], list[dspy.Example], Any]:
    """Check every input before any LM call: method, options, LM spec, questions, index.

    A saved program (``spec.program``) fills ``spec.method``; a ``runs:/``
    program is fetched from the MLflow store ``mlflow_dir``.

    Returns:
        The run config, the selected questions and the retriever (or ``None``).

    Raises:
        HCQRError: unknown method or LM spec, an option the method does not
            take, malformed questions, a missing or mismatched index; a saved
            program of another method, of a newer format, or compiled on some of
            these questions, or given options of its own.
    """
    from hcqr_dspy.program_io import read_meta, refuse_overlap, resolve_program_path

    saved = None
    if spec.program:
        folder = resolve_program_path(spec.program, mlflow_dir)
        saved = read_meta(folder)
        if spec.method and spec.method != saved["method"]:
            raise HCQRError(f"{spec.program} is a saved {saved['method']!r} program, not {spec.method!r}")
        spec.method = saved["method"]
    if spec.method not in PROGRAMS:
        raise HCQRError(f"unknown method {spec.method!r}; choose one of {', '.join(PROGRAMS)}")
    if saved and spec.program_options:
        raise HCQRError(f"{spec.program} is a saved program: its options come with it; drop "
                        + ", ".join("--" + k.replace("_", "-") for k in sorted(spec.program_options)))
    check_program_options(spec.method, spec.program_options)
    lm_cfg = parse_lm_spec(spec.lm, api_base=spec.api_base, api_key_env=spec.api_key_env)
    questions = select(load_questions(spec.dataset, labelled=spec.labelled), limit=spec.limit, seed=spec.seed, ids=spec.ids)
    if saved and saved.get("train"):
        refuse_overlap(saved["train"], questions, dataset_name(spec.dataset), f"saved program {spec.program}")
    retriever, index_info = open_index(spec.method, spec.index, spec.search_options, spec.encoder_backend)
    if saved:
        from hcqr_dspy.program_io import load_program

        program, _ = load_program(folder, retriever)
    else:
        try:
            program = make_program(spec.method, retriever, **spec.program_options)
        except ValueError as exc:
            raise HCQRError(f"method {spec.method!r}: {exc}") from None
    config = {
        "method": spec.method,
        "program": program.settings(),
        "saved_program": saved_program_record(spec.program, saved, folder) if saved else None,
        "dataset": str(Path(spec.dataset).resolve()) if Path(spec.dataset).exists() else spec.dataset,
        "questions": {**question_fingerprint(questions), "limit": spec.limit, "seed": spec.seed,
                      **({} if spec.labelled else {"labelled": False})},
        "index": index_info,
        "lm": {**lm_cfg.params(), "temperature": spec.temperature, "max_tokens": spec.max_tokens, "n_ctx": spec.n_ctx},
        "adapter": "JSONAdapter",
        "hcqr_dspy_version": __version__,
    }
    return config, questions, program


def open_index(method: str, index: str | None, search_options: dict[str, int] | None = None,
               encoder_backend: str | None = None) -> tuple[Any, dict[str, Any] | None]:
    """The retriever a method needs and the index record runs keep; ``(None, None)`` without retrieval.

    ``search_options`` (``nprobe``, ``efSearch``, ``k_factor``) are applied to the index
    and recorded with it, and so is ``encoder_backend`` (what embeds the
    queries); a method without retrieval refuses both.

    Raises:
        HCQRError: a retrieval method without an index, an index that does
            not load, or search options or an encoder backend without an index.
    """
    if not PROGRAMS[method].uses_retrieval:
        if search_options:
            raise HCQRError(f"method {method!r} retrieves nothing: search options ({', '.join(search_options)}) do not apply")
        if encoder_backend not in (None, "torch"):
            raise HCQRError(f"method {method!r} retrieves nothing: --encoder-backend does not apply")
        return None, None
    if not index:
        raise HCQRError(f"method {method!r} needs --index (build one with `hcqr index`)")
    retriever = load_index(index, search_options=search_options, encoder_backend=encoder_backend)
    runtimes = {p.encoder.spec.query_runtime for p in [retriever, *getattr(retriever, "retrievers", [])]
                if getattr(p, "encoder", None) is not None}
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
        # recorded only when not the default torch, so runs made before the option existed still resume
        **({"encoder_backend": next(iter(runtimes))} if runtimes - {"torch"} else {}),
    }


def dataset_name(dataset: str) -> str:
    """A dataset's name: the file stem (``medqa`` for ``.../medqa.json``) or the hub name."""
    return Path(dataset).stem if Path(dataset).exists() else dataset


def saved_program_record(source: str, meta: dict[str, Any], folder: Path) -> dict[str, Any]:
    """What a run records about the saved program it ran: where, its optimizer and recipe, its training set."""
    recipe = meta.get("recipe") or {}
    train = meta.get("train") or {}
    return {
        "source": str(source),
        "folder": str(Path(folder).resolve()),
        "optimizer": meta.get("optimizer"),
        "recipe": recipe.get("name") if isinstance(recipe, dict) else recipe,
        "created": meta.get("created"),
        "compile_run_id": meta.get("mlflow_run_id"),
        "train_dataset": train.get("dataset"),
        "train_count": train.get("train_count", len(train.get("ids") or [])),
        "val_count": train.get("val_count", 0),
    }


def default_run_dir(spec: EvalSpec, config: dict[str, Any]) -> Path:
    """``runs/<dataset>/<method>-<lm>-n<count>-s<seed>-<config hash>`` (``predict-<method>...`` for unlabelled
    questions): the same spec reuses (resumes) its folder."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]
    dataset = _slug(dataset_name(spec.dataset))
    lm = _slug(spec.lm.replace(":", "-").replace("/", "-"))
    kind = "" if spec.labelled else "predict-"
    return DEFAULT_RUNS / dataset / f"{kind}{spec.method}-{lm}-n{config['questions']['count']}-s{spec.seed}-{digest}"


def run_evaluation(
    spec: EvalSpec, mlflow_dir: str | Path | None = None, progress: bool = True, track: bool = True, lm: Any = None,
    on_row: Any = None,
) -> tuple[EvalResult, Path, str | None]:
    """Resolve, run (resuming if the run folder has rows) and track one evaluation.

    Every input is checked before the run folder is written: method and
    options, questions, index, saved program, and the LM (built, and a remote
    one asked one tiny question by :func:`hcqr_dspy.lm.check_lm`), so a failed
    attempt leaves nothing that would refuse the corrected command.

    Args:
        spec: The evaluation.
        mlflow_dir: MLflow store folder (see :func:`hcqr_dspy.tracking.store_dir`).
        progress: Show a progress bar.
        track: Track in MLflow.
        lm: A ready ``dspy.LM`` to use instead of building ``spec.lm``
            (tests, notebooks); ``spec.lm`` is still what the config records.
        on_row: Called with each new row as it is written (see :func:`hcqr_dspy.evaluate.evaluate`).

    Tracked, the MLflow run is named ``method · dataset · LM · zero-shot|compiled:<recipe>``
    (:func:`run_name`) and tagged likewise; its description links the compile run of a saved program;
    the questions are its input (an MLflow evaluation dataset); each question is a trace
    (:mod:`hcqr_dspy.traces`); and once every question is answered the traces are scored with
    ``mlflow.genai.evaluate`` (:func:`hcqr_dspy.scorers.score_run`; once per run: a rerun that answers
    nothing new does not score again).

    Returns:
        The result, the run folder and the MLflow run id (``None`` untracked).

    Raises:
        HCQRError: bad input or an unusable LM (before anything is written), an
            unusable run folder, :class:`~hcqr_dspy.run_folder.LMUnavailableError`
            or :class:`~hcqr_dspy.run_folder.ProgramError` mid-run.
    """
    from hcqr_dspy import tracking

    config, questions, program_module = resolve(spec, mlflow_dir)
    # the folder's one writer before the LM is loaded or asked: a second process on it is refused at once
    folder = RunFolder.claim(Path(spec.run_dir) if spec.run_dir else default_run_dir(spec, config), "eval")
    try:
        if lm is None:
            lm = build_lm(
                spec.lm, temperature=spec.temperature, max_tokens=spec.max_tokens, n_ctx=spec.n_ctx,
                api_base=spec.api_base, api_key_env=spec.api_key_env,
            )
            check_lm(lm)
        if track:  # a store that cannot be used is refused before the run folder is written
            tracking.open_store(mlflow_dir)
        folder.start(config)
        if {str(q.qid) for q in questions} - {r["qid"] for r in folder.rows()}:
            note_other_machine(folder, folder.record_session("eval", lm))  # only a session with questions to answer
        if not track:
            with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
                result = evaluate(program_module, questions, folder, spec.method, spec.num_threads, progress, on_row)
            return result, folder.path, None
        with tracking.store_outages(mlflow_dir):
            return _tracked_evaluation(spec, config, questions, program_module, lm, folder, mlflow_dir, progress,
                                       on_row)
    finally:
        folder.release()


def _tracked_evaluation(spec: EvalSpec, config: dict[str, Any], questions: list[dspy.Example], program_module: Any,
                        lm: Any, folder: RunFolder, mlflow_dir: str | Path | None, progress: bool,
                        on_row: Any) -> tuple[EvalResult, Path, str | None]:
    """The tracked part of :func:`run_evaluation`: the MLflow run, its input, traces and scores."""
    from hcqr_dspy import tracking

    old_id = tracking.existing_run_id(folder.mlflow_run_id, mlflow_dir)
    labelled = all(q.answer is not None for q in questions)
    dname = dataset_name(spec.dataset)
    program = program_label(config)
    kind = "evaluation" if labelled else "prediction"
    name = run_name(spec.method, dname, spec.lm, program, kind)
    tags = {"method": spec.method, "dataset": dname, "lm": spec.lm, "program": program, "kind": kind}
    # The MLflow run (and mlflow.dspy.autolog's trace callback) must be set up before
    # dspy.context: a context entered earlier keeps the callbacks it started with.
    with tracking.mlflow_run(name, config, tags=tags, run_id=old_id, store=mlflow_dir) as run:
        import mlflow

        run_id = run.info.run_id
        folder.set_mlflow_run_id(run_id)
        if old_id is None:
            tracking.describe_run(run_id, config, kind)
        questions_ds = tracking.questions_dataset(
            questions, f"{dname}-{config['questions']['content_sha256'][:12]}", run.info.experiment_id)
        if old_id is None:
            mlflow.log_input(questions_ds, context=kind)
        trace_tags = {"method": spec.method, "dataset": dname, "run_folder": str(folder.path.resolve()),
                      "lm": spec.lm, "program": program, "mlflow_run_id": run_id}
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            try:
                result = evaluate(program=program_module, examples=questions, folder=folder, method=spec.method,
                                  num_threads=spec.num_threads, progress=progress, on_row=on_row, trace_tags=trace_tags)
            except BaseException:
                # the records so far, best effort: the stop's own message (an outage, a full disk) must not be
                # replaced by this logging's failure; the next run logs them again
                with contextlib.suppress(Exception):
                    tracking.log_run_folder(folder)
                raise
            tracking.log_run_folder(folder)
        tracking.log_metrics(result.metrics)
        if result.ran or mlflow.get_run(run_id).data.tags.get(SCORED_TAG) != "true":
            from hcqr_dspy.scorers import score_run

            score_run(result.rows, questions_ds, labelled=labelled)
            mlflow.set_tag(SCORED_TAG, "true")
    return result, folder.path, run_id


SCORED_TAG = "hcqr.scored"


def note_other_machine(folder: RunFolder, session: dict[str, Any]) -> None:
    """Say on stderr when a resumed run's earlier rows were written on another machine or LM stack
    (:func:`hcqr_dspy.provenance.machine_key`): at temperature 0 the LM need not reply as it did there."""
    from hcqr_dspy.provenance import machine_key

    now = machine_key(session)
    earlier = [machine_key(s) for s in folder.sessions()[:-1] if s.get("command") == "eval"]
    other = [k for k in dict.fromkeys(earlier) if k != now]
    if other:
        print(f"hcqr: note: {folder.path}: earlier rows were written on another machine or LM stack ({other[-1]}); "
              f"this session runs on {now}; `hcqr compare` reports it", file=sys.stderr)


def program_label(config: dict[str, Any]) -> str:
    """``zero-shot``, or ``compiled:<recipe>`` for a saved program (``saved`` for one no optimizer made)."""
    saved = config.get("saved_program")
    if not saved:
        return "zero-shot"
    return f"compiled:{saved['recipe']}" if saved.get("recipe") else "saved"


def run_name(method: str, dataset: str, lm: str, program: str, kind: str = "evaluation") -> str:
    """An evaluation run's MLflow name: ``hcqr · medqa · local · zero-shot`` (``predict`` first for predictions)."""
    return " · ".join((["predict"] if kind == "prediction" else []) + [method, dataset, lm, program])


def answers_target(out: str | Path) -> Path:
    """Check where :func:`write_answers` will write, before any LM call.

    Raises:
        HCQRError: ``out`` is a folder, or its folder cannot be created or written.
    """
    from hcqr_dspy.run_folder import write_probe

    path = Path(out)
    if path.is_dir():
        raise HCQRError(f"--out {path} is a folder; give a file (answers.jsonl or answers.json)")
    try:
        write_probe(path.parent)
    except OSError as exc:
        raise HCQRError(f"--out {path}: its folder cannot be written ({exc.strerror or exc})") from None
    return path


def write_answers(out: str | Path, rows: Sequence[dict[str, Any]], questions: Sequence[dspy.Example]) -> Path:
    """Write a run's answers for people and programs: one record per question, in question order
    (:func:`hcqr_dspy.evaluate.answer_record`: the letter and its text, validity, hypothesis, queries and
    passages; ``gold`` and ``correct`` when the question has a gold answer).

    ``out`` ending in ``.json`` gets one object ``{qid: record}``; any other name gets JSON Lines. The
    file is written whole to a temporary name and renamed, so a reader never sees half of it.
    """
    from hcqr_dspy.evaluate import answer_record

    by_qid = {r["qid"]: r for r in rows}
    records = []
    for q in questions:
        r = by_qid.get(q.qid)
        if r is None:
            continue
        record = answer_record(q.qid, q.options, r.get("prediction"), r["valid"], r.get("error"), r.get("hypothesis"),
                               r.get("queries"), r.get("passages"))
        if q.answer is not None:
            record.update(gold=q.answer, correct=r["correct"])
        records.append(record)
    path = Path(out)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".json":
        tmp.write_text(json.dumps({r["qid"]: r for r in records}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    else:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)
    return path
