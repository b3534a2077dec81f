"""Experiment grids: methods x datasets sharing one LM, index, budget and question sample.

An experiment file (YAML) looks like::

    name: paper_main
    lm: local:qwen2.5-coder-0.5b          # any --lm spec
    index: indexes/medrag-all-bm25         # one shared index (every retrieval method)
    search_options: {nprobe: 32}           # optional: dense indexes' search-time options (nprobe, efSearch)
    budget: 15                             # passages shown to the answer step, every method
    questions: {limit: 20, seed: 0}        # the same sample in every cell (or ids: [...])
    datasets:
      medqa: ../shared/data/benchmark/medqa.json
      mmlu: ../shared/data/benchmark/mmlu.json
    methods: [cot, simple_rag, hcqr]
    method_options:                        # optional, per method
      hcqr: {k_per_query: 5, fusion: score_sum}
    reference: simple_rag                  # optional: the comparison's reference method
    judge: {lm: null, mode: context}       # optional: DUR judging (lm null = the run's LM)

Relative paths are resolved against the file's folder. Every key, method and
dataset is checked before any LM call. ``hcqr experiment FILE`` runs the
cells in order, each its own run folder under
``runs/experiments/<name>/<dataset>/<method>`` (so an interrupted experiment
resumes cell by cell, question by question) and its own MLflow child run
under one parent run; DSPy's response cache makes a finished cell free to
re-run. After the cells, each dataset's runs are compared (table, exact
McNemar tests, plots) and the reports logged to the parent run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError

KEYS = {"name", "lm", "index", "budget", "questions", "datasets", "methods", "method_options", "reference",
        "judge", "max_tokens", "n_ctx", "api_base", "api_key_env", "threads", "description", "search_options"}
QUESTION_KEYS = {"limit", "seed", "ids"}
JUDGE_KEYS = {"lm", "mode"}


class ExperimentError(HCQRError):
    """An experiment file is malformed (unknown key, method or dataset ...)."""


@dataclass
class Experiment:
    """A parsed, validated experiment file."""

    name: str
    lm: str
    datasets: dict[str, str]
    methods: list[str]
    index: str | None = None
    budget: int = 15
    questions: dict[str, Any] = field(default_factory=dict)
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    reference: str | None = None
    judge: dict[str, Any] | None = None
    max_tokens: int = 1024
    n_ctx: int = 8192
    api_base: str | None = None
    api_key_env: str | None = None
    threads: int = 1
    description: str = ""
    search_options: dict[str, int] = field(default_factory=dict)


def load_experiment(
    path: str | Path, limit: int | None = None, lm: str | None = None, only_datasets: list[str] | None = None
) -> Experiment:
    """Read and validate an experiment file (no LM call, no index load).

    Args:
        path: The YAML file.
        limit: Override ``questions.limit`` (e.g. a quick run).
        lm: Override ``lm``.
        only_datasets: Run only these of the file's datasets (names as in
            the file), e.g. one dataset on a slow machine.

    Raises:
        ExperimentError: unreadable YAML, unknown keys (the valid ones are
            listed), unknown methods or LM spec, missing dataset files or index.
    """
    import yaml

    from hcqr_dspy.lm import parse_lm_spec
    from hcqr_dspy.programs import PROGRAMS, accepted_options

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExperimentError(f"cannot read experiment file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ExperimentError(f"{path}: expected a mapping of keys ({', '.join(sorted(KEYS))})")
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise ExperimentError(f"{path}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(KEYS))}")
    for required in ("name", "lm", "datasets", "methods"):
        if not raw.get(required) and not (required == "lm" and lm):
            raise ExperimentError(f"{path}: '{required}' is required")
    base = path.parent

    def resolve(p: str) -> str:
        q = Path(p)
        return str(q if q.is_absolute() else (base / q).resolve())

    methods = list(raw["methods"])
    bad = [m for m in methods if m not in PROGRAMS]
    if bad:
        raise ExperimentError(f"{path}: unknown method(s) {', '.join(map(str, bad))}; valid methods: {', '.join(PROGRAMS)}")
    options = raw.get("method_options") or {}
    bad = sorted(set(options) - set(methods))
    if bad:
        raise ExperimentError(f"{path}: method_options for method(s) not in the grid: {', '.join(bad)}")
    if not isinstance(raw["datasets"], dict):
        raise ExperimentError(f"{path}: 'datasets' must map names to files, e.g. medqa: ../shared/data/benchmark/medqa.json")
    datasets = {}
    for name, file in raw["datasets"].items():
        resolved = resolve(str(file))
        if not Path(resolved).is_file():
            raise ExperimentError(f"{path}: dataset {name!r} file {resolved} not found")
        datasets[str(name)] = resolved
    if only_datasets is not None:
        bad = [d for d in only_datasets if d not in datasets]
        if bad or not only_datasets:
            raise ExperimentError(f"{path}: unknown dataset(s) {', '.join(bad) or '(none given)'}; the file has {', '.join(datasets)}")
        datasets = {d: datasets[d] for d in only_datasets}
    questions = dict(raw.get("questions") or {})
    bad = sorted(set(questions) - QUESTION_KEYS)
    if bad:
        raise ExperimentError(f"{path}: unknown questions key(s) {', '.join(bad)}; valid: {', '.join(sorted(QUESTION_KEYS))}")
    if limit is not None:
        questions["limit"] = limit
    index = resolve(raw["index"]) if raw.get("index") else None
    if any(PROGRAMS[m].uses_retrieval for m in methods):
        if not index:
            raise ExperimentError(f"{path}: retrieval methods need 'index' (build one with `hcqr index`)")
        if not (Path(index) / "manifest.json").is_file():
            raise ExperimentError(f"{path}: index {index} is not an hcqr index folder (no manifest.json)")
    search_options = raw.get("search_options") or {}
    if not isinstance(search_options, dict):
        raise ExperimentError(f"{path}: 'search_options' must be a mapping, e.g. {{nprobe: 32, efSearch: 128}}")
    try:
        from hcqr_dspy.retrieval.vector_index import check_search_options

        search_options = check_search_options(search_options)
    except HCQRError as exc:
        raise ExperimentError(f"{path}: {exc}") from None
    if search_options and not index:
        raise ExperimentError(f"{path}: 'search_options' need an 'index'")
    judge = raw.get("judge")
    if judge is not None:
        if not isinstance(judge, dict) or set(judge) - JUDGE_KEYS:
            raise ExperimentError(f"{path}: 'judge' takes keys {', '.join(sorted(JUDGE_KEYS))}")
        if judge.get("mode", "context") not in ("context", "passage"):
            raise ExperimentError(f"{path}: judge mode must be context or passage")
    reference = raw.get("reference")
    if reference is not None and reference not in methods:
        raise ExperimentError(f"{path}: reference {reference!r} is not one of the methods")
    exp = Experiment(
        name=str(raw["name"]), lm=lm or str(raw["lm"]), datasets=datasets, methods=methods, index=index,
        budget=int(raw.get("budget", 15)), questions=questions, method_options=options, reference=reference,
        judge=judge, max_tokens=int(raw.get("max_tokens", 1024)), n_ctx=int(raw.get("n_ctx", 8192)),
        api_base=raw.get("api_base"), api_key_env=raw.get("api_key_env"), threads=int(raw.get("threads", 1)),
        description=str(raw.get("description", "")), search_options=search_options,
    )
    try:
        parse_lm_spec(exp.lm, api_base=exp.api_base, api_key_env=exp.api_key_env)
    except HCQRError as exc:
        raise ExperimentError(f"{path}: {exc}") from None
    for m, opts in options.items():
        valid = accepted_options(PROGRAMS[m])
        bad = sorted(set(opts or {}) - valid)
        if bad:
            raise ExperimentError(f"{path}: unknown option(s) {', '.join(bad)} for method {m!r}; valid: {', '.join(sorted(valid))}")
    return exp


def run_experiment(exp: Experiment, runs_root: str | Path = "runs/experiments", mlflow_dir: str | Path | None = None,
                   progress: bool = True, lm: Any = None) -> dict[str, Any]:
    """Run every cell (dataset x method), then compare each dataset's runs.

    Args:
        exp: The validated experiment.
        runs_root: Root of the run folders.
        mlflow_dir: MLflow store folder.
        progress: Progress bars.
        lm: A ready ``dspy.LM`` for every cell instead of building ``exp.lm`` (tests).

    Returns:
        ``{"parent_run_id", "cells": {dataset: {method: metrics}}, "reports": {dataset: path}}``.

    Raises:
        HCQRError: from any cell (finished cells and questions are kept;
            re-running resumes).
    """
    import mlflow

    from hcqr_dspy import tracking
    from hcqr_dspy.compare import compare
    from hcqr_dspy.programs import PROGRAMS
    from hcqr_dspy.run import EvalSpec, run_evaluation

    root = Path(runs_root) / exp.name
    root.mkdir(parents=True, exist_ok=True)
    state_path = root / "experiment.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    params = {k: v for k, v in exp.__dict__.items() if k not in ("description",)}
    out: dict[str, Any] = {"cells": {}, "reports": {}}
    with tracking.mlflow_run(f"experiment {exp.name}", params, tags={"kind": "experiment"},
                             run_id=state.get("parent_run_id"), store=mlflow_dir, traces=False) as parent:
        state["parent_run_id"] = out["parent_run_id"] = parent.info.run_id
        state_path.write_text(json.dumps(state, indent=2) + "\n")
        for dname, dfile in exp.datasets.items():
            out["cells"][dname] = {}
            run_dirs = []
            for method in exp.methods:
                spec = EvalSpec(
                    method=method, dataset=dfile, index=exp.index, lm=exp.lm,
                    limit=exp.questions.get("limit"), seed=int(exp.questions.get("seed", 0)),
                    ids=exp.questions.get("ids"),
                    program_options={"budget": exp.budget, **exp.method_options.get(method, {})},
                    max_tokens=exp.max_tokens, n_ctx=exp.n_ctx, api_base=exp.api_base, api_key_env=exp.api_key_env,
                    num_threads=exp.threads, run_dir=str(root / dname / method),
                    search_options=exp.search_options if PROGRAMS[method].uses_retrieval else {},
                )
                result, run_dir, _ = run_evaluation(spec, mlflow_dir=mlflow_dir, progress=progress, lm=lm)
                out["cells"][dname][method] = result.metrics
                run_dirs.append(run_dir)
            if exp.judge is not None:
                _judge_cells(exp, run_dirs, mlflow_dir)
            if len(run_dirs) > 1:
                _, files = compare(run_dirs, reference=exp.reference, out_dir=root / dname / "comparison")
                out["reports"][dname] = str(files[0])
                for f in files:
                    mlflow.log_artifact(str(f), artifact_path=f"comparison/{dname}")
    return out


def _judge_cells(exp: Experiment, run_dirs: list[Path], mlflow_dir) -> None:
    import mlflow

    from hcqr_dspy import tracking
    from hcqr_dspy.dur import judge_run
    from hcqr_dspy.lm import build_lm
    from hcqr_dspy.retrieval import load_index

    spec = exp.judge.get("lm") or exp.lm
    lm = build_lm(spec, max_tokens=256, n_ctx=exp.n_ctx, api_base=exp.api_base, api_key_env=exp.api_key_env)
    retriever = load_index(exp.index, search_options=exp.search_options) if exp.index else None
    for run_dir in run_dirs:
        config = json.loads((run_dir / "config.json").read_text())
        if not config.get("index"):
            continue
        metrics = judge_run(run_dir, retriever, lm, mode=exp.judge.get("mode", "context"))
        with mlflow.start_run(run_id=config["mlflow_run_id"], nested=True):
            tracking.log_metrics(metrics)
