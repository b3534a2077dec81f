"""``hcqr demo``: HCQR, CoT and Simple RAG on the embedded demo questions, one evaluation each, then compared.

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from hcqr_dspy.cli.ask_command import show_answer
from hcqr_dspy.cli.common import RETRIEVER_KINDS, add_lm_args, positive_int, say_progress, tracking_store, ui_hint
from hcqr_dspy.errors import RetrievalIndexError
from hcqr_dspy.lm import parse_lm_spec
from hcqr_dspy.resources import shipped_dir
from hcqr_dspy.retrieval import build_retriever, load_corpus, load_index

# The demo's questions: a seeded sample of DEFAULT_LIMIT of the DEMO_QUESTIONS shipped, so that on a 2-core
# machine with the 1.5B model the three methods finish in under half an hour (docs/install.md has the figures).
DEFAULT_LIMIT, DEMO_QUESTIONS = 10, 20

# What stands in for a method's pace before its first question, from the first HCQR question's stages: Simple
# RAG's one call reads a retrieved context, as HCQR's answer step does (scaled by the passages each shows, see
# DemoPace); CoT's one call reads the question and options and reasons, as HCQR's hypothesis step does. Other
# methods: the whole HCQR question.
_PROXY_STAGE = {"simple_rag": "answer", "cot": "hypothesis"}


class DemoPace:
    """How long the demo has left on this machine, from the seconds of the questions it answered.

    A method's pace is the mean seconds of the questions it answered in this run (resumed rows are left out:
    their seconds may come from the response cache). Before a method's first question its pace is a stand-in
    taken from the first HCQR question's stages (:data:`_PROXY_STAGE`), or that question's whole time. Simple
    RAG shows ``budget`` passages where HCQR's answer step showed the distinct ones its queries fused (often
    fewer), so its stand-in is HCQR's answer step scaled by the prompt it would send: the answer step's prompt
    tokens with its context tokens (``context_cut.tokens_after``) times ``budget / passages shown``.

    Args:
        methods: The methods, in run order.
        todo: Questions each method still has to answer (its resumed rows left out).
        budget: The passages a retrieval method shows (the programs' default, ``hcqr_dspy.programs``).
    """

    def __init__(self, methods: list[str], todo: dict[str, int], budget: int = 15):
        self.budget = budget
        self.methods = methods
        self.todo = dict(todo)
        self.seconds: dict[str, list[float]] = {m: [] for m in methods}
        self.reference: dict | None = None  # the first row answered in this run, HCQR's if there is one

    def add(self, method: str, row: dict) -> None:
        """Count one answered question."""
        self.todo[method] -= 1
        self.seconds[method].append(float(row["seconds"]))
        if self.reference is None or (method == "hcqr" and self.reference.get("method") != "hcqr"):
            self.reference = {"method": method, **row}

    def pace(self, method: str) -> tuple[float, bool]:
        """Seconds a question of ``method`` and whether that is measured (``False``: a stand-in)."""
        if self.seconds[method]:
            return sum(self.seconds[method]) / len(self.seconds[method]), True
        stage = (self.reference.get("stages") or {}).get(_PROXY_STAGE.get(method, ""), {})
        if not stage.get("seconds"):
            return float(self.reference["seconds"]), False
        scale = 1.0
        shown = len(self.reference.get("passages") or [])
        context = (self.reference.get("context_cut") or {}).get("tokens_after")
        prompt = stage.get("prompt_tokens")
        if method == "simple_rag" and context and prompt and 0 < shown < self.budget:
            scale = (prompt - context + context * self.budget / shown) / prompt
        return float(stage["seconds"]) * scale, False

    def left(self) -> float:
        """Seconds left, summed over the methods' remaining questions."""
        if self.reference is None:
            return 0.0
        return sum(self.todo[m] * self.pace(m)[0] for m in self.methods)

    def line(self) -> str:
        """``about 21 min left: hcqr 41 s, cot ~9 s, simple_rag ~30 s a question (~ from HCQR's stages)``."""
        paces = [(m, *self.pace(m)) for m in self.methods if self.todo[m] > 0]
        each = ", ".join(f"{m} {'' if measured else '~'}{sec:.0f} s" for m, sec, measured in paces)
        estimated = any(not measured for _, _, measured in paces)
        return f"about {_minutes(self.left())} left on this machine" + (
            f": {each} a question" + (" (~ estimated from the first HCQR question's steps)" if estimated else "")
            if paces
            else ""
        )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def cmd_demo(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy, mlflow and matplotlib take seconds, `hcqr --help` none
    from hcqr_dspy.data import load_questions, select
    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.reporting import compare, metrics_table
    from hcqr_dspy.tracking.comparison import track_comparison
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    parse_lm_spec(args.lm, api_base=args.api_base, api_key_env=args.api_key_env)  # a bad --lm refused before the index
    demo_dir = shipped_dir("demo")  # package data: the same from a wheel, an editable install or a checkout
    dataset = demo_dir / "questions.json"
    corpus = load_corpus(demo_dir / "corpus.jsonl")
    index = Path(args.index)
    try:
        retriever = load_index(index, corpus=corpus)
        say_progress(f"demo index: {index} (reused)")
    except RetrievalIndexError:
        say_progress(f"demo index: building {args.retriever} index over {len(corpus)} passages -> {index}")
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
        show_answer(row, q.options, retriever)
        print(f"Gold answer: {q.answer} ({'right' if row['correct'] else 'wrong'})\n", flush=True)
        shown["done"] = True

    lm_slug = args.lm.replace(":", "-").replace("/", "-")
    plans = []  # (method, run folder, rows it already has)
    for method in methods:
        run_dir = Path(args.runs) / f"{method}-{lm_slug}-n{args.limit or 'all'}"
        earlier = RunFolder(run_dir).rows() if (run_dir / "predictions.jsonl").exists() else []
        plans.append((method, run_dir, [r for r in earlier if r["qid"] in questions]))
    pace = DemoPace(methods, {m: len(questions) - len(earlier) for m, _, earlier in plans})
    say_progress(
        f"demo: {len(questions)} questions x {len(methods)} methods ({', '.join(methods)}); the time it takes on "
        "this machine is estimated from its first question"
        + (f" (all {DEMO_QUESTIONS}: --limit {DEMO_QUESTIONS})" if len(questions) < DEMO_QUESTIONS else "")
    )
    results, run_dirs = [], []
    for method, run_dir, earlier in plans:
        tally = {"done": len(earlier), "right": sum(bool(r["correct"]) for r in earlier)}
        say_progress(
            f"\n== {method} on {len(questions)} demo questions with --lm {args.lm}"
            + (f" ({len(earlier)} already answered)" if earlier else "")
        )
        if method == "hcqr" and earlier and not shown["done"]:
            show_first(earlier[0])

        def on_row(row: dict, method: str = method, tally: dict = tally) -> None:
            tally["done"] += 1
            tally["right"] += bool(row["correct"])
            pace.add(method, row)
            mark = "right" if row["correct"] else ("invalid" if not row["valid"] else "wrong")
            say_progress(
                f"  {method:<11} {tally['done']:>2}/{len(questions)}  {row['qid']}: {row['prediction'] or '-'} "
                f"(gold {row['gold']}, {mark}, {row['seconds']:.0f} s)   accuracy so far "
                f"{tally['right']}/{tally['done']} = {tally['right'] / tally['done']:.0%}"
            )
            if method == "hcqr" and not shown["done"]:
                show_first(row)
            answered = len(pace.seconds[method])
            if pace.todo[method] and (answered == 1 or answered % 5 == 0):
                say_progress(f"  {pace.line()}")

        spec = EvalSpec(
            method=method,
            dataset=str(dataset),
            index=str(index),
            lm=args.lm,
            limit=args.limit,
            max_tokens=args.max_tokens,
            n_ctx=args.n_ctx,
            api_base=args.api_base,
            api_key_env=args.api_key_env,
            run_dir=str(run_dir),
        )
        result, run_dir, run_id = run_evaluation(spec, mlflow_dir=args.mlflow_dir, progress=False, on_row=on_row)
        results.append((method, result.metrics))
        run_dirs.append(run_dir)
        say_progress(f"   {run_dir}  (MLflow run {run_id})")
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
    print(
        f"\nRuns: {args.runs}/ · MLflow store: {tracking_store(args)} · view with {ui_hint(args)} (http://127.0.0.1:5000)"
    )
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
    p.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_LIMIT,
        help=f"demo questions to run, a seeded sample (default: {DEFAULT_LIMIT}; all {DEMO_QUESTIONS}: --limit "
        f"{DEMO_QUESTIONS})",
    )
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    add_lm_args(p)
    p.set_defaults(func=cmd_demo)
