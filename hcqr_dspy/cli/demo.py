"""``hcqr demo``: HCQR, CoT and Simple RAG on the embedded demo questions, one evaluation each, then compared.

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from hcqr_dspy.cli.ask import _show_answer
from hcqr_dspy.cli.common import RETRIEVER_KINDS, _positive_int, _progress, _store, _ui_hint
from hcqr_dspy.errors import RetrievalIndexError
from hcqr_dspy.resources import shipped_dir
from hcqr_dspy.retrieval import build_retriever, load_corpus, load_index


def cmd_demo(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy, mlflow and matplotlib take seconds, `hcqr --help` none
    from hcqr_dspy.data import load_questions, select
    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.reporting import compare, metrics_table
    from hcqr_dspy.tracking.comparison import track_comparison
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    demo_dir = shipped_dir("demo")  # package data: the same from a wheel, an editable install or a checkout
    dataset = demo_dir / "questions.json"
    corpus = load_corpus(demo_dir / "corpus.jsonl")
    index = Path(args.index)
    try:
        retriever = load_index(index, corpus=corpus)
        _progress(f"demo index: {index} (reused)")
    except RetrievalIndexError:
        _progress(f"demo index: building {args.retriever} index over {len(corpus)} passages -> {index}")
        build_retriever(corpus, args.retriever).save(index)
        retriever = load_index(index)
    questions = {q.qid: q for q in select(load_questions(dataset), limit=args.limit)}
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    shown = {"done": False}

    def show_first(row: dict) -> None:
        """The first complete HCQR answer, in full: what the method does, on one question."""
        q = questions[row["qid"]]
        print(f"\nFirst HCQR answer ({row['qid']}, {row['seconds']:.0f} s):\nQuestion: {q.question}")
        for letter, text in q.options.items():
            print(f"  {letter}. {text}")
        _show_answer(row, q.options, retriever)
        print(f"Gold answer: {q.answer} ({'right' if row['correct'] else 'wrong'})\n", flush=True)
        shown["done"] = True

    results, run_dirs = [], []
    for method in methods:
        lm_slug = args.lm.replace(":", "-").replace("/", "-")
        run_dir = Path(args.runs) / f"{method}-{lm_slug}-n{args.limit or 'all'}"
        earlier = RunFolder(run_dir).rows() if (run_dir / "predictions.jsonl").exists() else []
        earlier = [r for r in earlier if r["qid"] in questions]
        tally = {"done": len(earlier), "right": sum(bool(r["correct"]) for r in earlier)}
        _progress(
            f"\n== {method} on {len(questions)} demo questions with --lm {args.lm}"
            + (f" ({len(earlier)} already answered)" if earlier else "")
        )
        if method == "hcqr" and earlier and not shown["done"]:
            show_first(earlier[0])

        def on_row(row: dict, method: str = method, tally: dict = tally) -> None:
            tally["done"] += 1
            tally["right"] += bool(row["correct"])
            mark = "right" if row["correct"] else ("invalid" if not row["valid"] else "wrong")
            _progress(
                f"  {method:<11} {tally['done']:>2}/{len(questions)}  {row['qid']}: {row['prediction'] or '-'} "
                f"(gold {row['gold']}, {mark}, {row['seconds']:.0f} s)   accuracy so far "
                f"{tally['right']}/{tally['done']} = {tally['right'] / tally['done']:.0%}"
            )
            if method == "hcqr" and not shown["done"]:
                show_first(row)

        spec = EvalSpec(
            method=method,
            dataset=str(dataset),
            index=str(index),
            lm=args.lm,
            limit=args.limit,
            max_tokens=args.max_tokens,
            run_dir=str(run_dir),
        )
        result, run_dir, run_id = run_evaluation(spec, mlflow_dir=args.mlflow_dir, progress=False, on_row=on_row)
        results.append((method, result.metrics))
        run_dirs.append(run_dir)
        _progress(f"   {run_dir}  (MLflow run {run_id})")
    print()
    if len(run_dirs) > 1:
        reference = "simple_rag" if "simple_rag" in methods else methods[0]
        out = Path(args.runs) / "comparison"
        report, files = compare(run_dirs, reference=reference, out_dir=out)
        print(report.split("\n\n")[1])  # the comparison table: accuracy ± SE, cost, McNemar vs the reference
        comparison_id = track_comparison(out, mlflow_dir=args.mlflow_dir)
        print(
            f"\nComparison: {files[0]} (plots beside it, accuracy_vs_cost.png among them; MLflow run {comparison_id})"
        )
    else:
        print(metrics_table(results))
    print(f"\nRuns: {args.runs}/ · MLflow store: {_store(args)} · view with {_ui_hint(args)} (http://127.0.0.1:5000)")
    return 0


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``demo`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("demo", help="run HCQR, CoT and Simple RAG on the embedded demo questions")
    p.add_argument("--index", default="indexes/demo", help="demo index folder (built if missing)")
    p.add_argument("--retriever", choices=RETRIEVER_KINDS, default="dense", help="retriever of a demo index built now")
    p.add_argument(
        "--methods",
        default="hcqr,cot,simple_rag",
        help="comma-separated methods, run in this order (the first HCQR answer is shown in full)",
    )
    p.add_argument("--runs", default="runs/demo", help="folder of the demo's run folders (resumed if present)")
    p.add_argument("--limit", type=_positive_int, default=None, help="demo questions to run (default: all 20)")
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.add_argument("--lm", default="local", help="LM spec (see `hcqr eval --help`)")
    p.add_argument("--max-tokens", type=_positive_int, default=1024, help="output tokens per LM call")
    p.set_defaults(func=cmd_demo)
