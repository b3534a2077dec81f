"""``hcqr eval`` (evaluate a method on a benchmark) and ``hcqr predict`` (answer a file of questions):
each one evaluation (:mod:`hcqr_dspy.workflows.evaluate`).

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from hcqr_dspy.cli.common import (
    add_program_args,
    add_run_args,
    id_list,
    parsed_program_options,
    parsed_search_options,
    tracking_store,
    ui_hint,
)


def _spec(spec_class, args: argparse.Namespace, dataset: str, labelled: bool):
    """The ``EvalSpec`` of an ``eval`` or ``predict`` command line (``spec_class``: imported by the caller)."""
    return spec_class(
        method=args.method if args.program else (args.method or "hcqr"),
        dataset=dataset,
        index=args.index,
        lm=args.lm,
        limit=args.limit,
        seed=args.seed,
        ids=id_list(args.ids),
        program_options=parsed_program_options(args),
        max_tokens=args.max_tokens,
        n_ctx=args.n_ctx,
        api_base=args.api_base,
        api_key_env=args.api_key_env,
        num_threads=args.threads,
        run_dir=args.run_dir,
        program=args.program,
        answer_step=getattr(args, "answer_step", None),
        search_options=parsed_search_options(args),
        encoder_backend=args.encoder_backend,
        labelled=labelled,
    )


def cmd_eval(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy and the workflow's layers take seconds, `hcqr --help` none
    from hcqr_dspy.reporting import metrics_table
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    spec = _spec(EvalSpec, args, args.dataset, labelled=True)
    result, run_dir, run_id = run_evaluation(
        spec, mlflow_dir=args.mlflow_dir, track=not args.no_mlflow, traces=args.traces, strict_setup=args.strict_setup
    )
    print(metrics_table([(spec.method + (f" ({args.program})" if args.program else ""), result.metrics)]))
    print(f"\n{result.ran} questions run now, {result.resumed} resumed from {run_dir / 'predictions.jsonl'}")
    if run_id:
        print(f"MLflow run {run_id} in {tracking_store(args)} (view with {ui_hint(args)})")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy and the workflow's layers take seconds, `hcqr --help` none
    from hcqr_dspy.reporting import metrics_table
    from hcqr_dspy.workflows.evaluate import run_prediction
    from hcqr_dspy.workflows.specs import EvalSpec

    spec = _spec(EvalSpec, args, args.input, labelled=False)
    result, run_dir, run_id, out = run_prediction(
        spec, args.out, mlflow_dir=args.mlflow_dir, track=not args.no_mlflow, traces=args.traces
    )
    print(metrics_table([(spec.method + (f" ({args.program})" if args.program else ""), result.metrics)]))
    scored = "accuracy" in result.metrics
    print(
        f"\n{result.saved} answers written to {out}"
        + (" (with gold answers: scored)" if scored else "")
        + f"; {result.ran} questions run now, {result.resumed} resumed from {run_dir / 'predictions.jsonl'}"
    )
    if run_id:
        print(f"MLflow run {run_id} in {tracking_store(args)} (view with {ui_hint(args)})")
    return 0


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``eval`` and ``predict`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("eval", help="evaluate a method on a benchmark (resumable, tracked in MLflow)")
    add_program_args(p)
    p.add_argument(
        "--answer-step",
        default=None,
        help="answer with this saved program's answer step (its instructions and demos) inside a fresh --method, "
        "e.g. the oracle_rag ceiling under a compiled HCQR's answer step; same forms as --program "
        "(default: the method's zero-shot answer step)",
    )
    p.add_argument(
        "--dataset",
        required=True,
        help="questions: a MIRAGE-format .json or .jsonl file, a saved Hugging Face dataset's folder (FOLDER, or "
        "FOLDER:SPLIT for a DatasetDict), an MLflow evaluation dataset (mlflow:NAME or mlflow:ID in --mlflow-dir's "
        "store; mlflow:REF@STORE for another store) or a hub dataset name",
    )
    add_run_args(p, "evaluate")
    p.add_argument(
        "--strict-setup",
        action="store_true",
        help="resuming a run folder, refuse (before any question, nothing written) to answer on another setup than "
        "its earlier sessions recorded: model file, llama.cpp build and CPU features, engine settings, endpoint "
        "model card, dspy / llama-cpp-python / litellm versions (default: recorded, noted, and flagged by compare)",
    )
    p.set_defaults(func=cmd_eval)

    p = command(
        "predict",
        help="answer a file of questions, with or without gold answers (resumable, tracked)",
        description="Answer every question of a file with a program (typically a compiled one: --program)\n"
        "and write the answers, with their hypothesis, queries and passages, to --out. Questions\n"
        "need no gold answer; a file that has them is scored too. The run folder records each\n"
        "answer as it finishes: the same command resumes an interrupted run.",
    )
    add_program_args(p)
    p.add_argument(
        "--input",
        required=True,
        help="questions: a MIRAGE-format .json file ({qid: {question, options[, answer]}}) or a .jsonl file "
        "(one {id, question, options[, answer]} per line)",
    )
    p.add_argument("--out", required=True, help="answers file: .jsonl (one answer per line) or .json ({qid: answer})")
    add_run_args(p, "answer")
    p.set_defaults(func=cmd_predict)
