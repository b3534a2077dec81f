"""``hcqr ask``: answer one question and show how (hypothesis, queries, passages, answer), with what the
command is doing on stderr. It makes the checks of an evaluation (:mod:`hcqr_dspy.workflows.specs`).

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from hcqr_dspy.cli.common import (
    add_lm_args,
    add_program_args,
    parsed_program_options,
    parsed_search_options,
    positive_int,
    say_progress,
)
from hcqr_dspy.errors import DataError, HCQRError
from hcqr_dspy.lm import build_lm, check_lm, parse_lm_spec
from hcqr_dspy.retrieval import load_index


def _read_question(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    # imported when the command runs: dspy and pydantic take seconds, `hcqr --help` none
    from hcqr_dspy.config import read_json
    from hcqr_dspy.data import check_question

    if args.json:
        row = read_json(args.json, DataError, "question file")
        if isinstance(row, dict) and "question" not in row and len(row) == 1:
            row = next(iter(row.values()))  # a one-question MIRAGE file
        ex = check_question("ask", row, args.json, labelled=False)
        return ex.question, ex.options
    if not args.question:
        raise DataError("give --question and --option A=... --option B=..., or --json FILE")
    options = {}
    for item in args.option or []:
        key, sep, text = item.partition("=")
        if not sep:
            raise DataError(f"--option {item!r} must look like A=text")
        if key.strip().upper() in {k.upper() for k in options}:
            raise DataError(f"--option {key.strip()} is given twice; each option letter once")
        options[key.strip()] = text
    ex = check_question("ask", {"question": args.question, "options": options}, "--option", labelled=False)
    return ex.question, ex.options


def cmd_ask(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy, the programs and the retrievers' models take seconds, `hcqr --help` none
    import dspy

    from hcqr_dspy.evaluation.answering import LM_UNAVAILABLE
    from hcqr_dspy.evaluation.outages import lm_failure
    from hcqr_dspy.lm.adapter import HCQRAdapter
    from hcqr_dspy.programs import refuse_bound
    from hcqr_dspy.programs.program_base import observe_stages
    from hcqr_dspy.workflows.specs import build_program, check_retrieval_inputs, resolve_method

    question, options = _read_question(args)
    parse_lm_spec(args.lm, api_base=args.api_base, api_key_env=args.api_key_env)
    method, saved = resolve_method(
        args.method if args.program else (args.method or "hcqr"),
        args.program,
        parsed_program_options(args),
        getattr(args, "mlflow_dir", None),
    )
    refuse_bound(method, "hcqr ask")
    retriever = None
    if check_retrieval_inputs(method, args.index, parsed_search_options(args), args.encoder_backend):
        t0 = time.perf_counter()
        say_progress(f"loading the index {args.index} ...")
        retriever = load_index(
            args.index, search_options=parsed_search_options(args), encoder_backend=args.encoder_backend
        )
        say_progress(f"  {len(retriever.corpus)} passages ({retriever.kind}) in {time.perf_counter() - t0:.1f} s")
    program, meta = build_program(method, retriever, parsed_program_options(args), saved)
    if saved is not None:
        print(f"Program: saved {method} from {args.program} (optimizer {meta.get('optimizer') or 'none'})")
    t0 = time.perf_counter()
    say_progress(f"loading the model {args.lm} ...")
    lm = build_lm(
        args.lm, max_tokens=args.max_tokens, n_ctx=args.n_ctx, api_base=args.api_base, api_key_env=args.api_key_env
    )
    check_lm(lm)
    say_progress(f"  ready in {time.perf_counter() - t0:.1f} s; answering with {method}")
    with dspy.context(lm=lm, adapter=HCQRAdapter()), observe_stages(_stage_progress):
        try:
            pred = program(question=question, options=options)
        except LM_UNAVAILABLE as exc:
            raise HCQRError(
                f"the LM stopped answering or cannot be used ({lm_failure(exc)}); nothing was answered"
            ) from None
    show_answer({**pred.toDict(), "answer": pred.answer}, options, retriever, args.width)
    return 0 if pred.valid else 1


def _stage_progress(name: str, record: dict | None) -> None:
    """Print a program stage as it starts and ends (:func:`hcqr_dspy.programs.program_base.observe_stages`)."""
    if record is None:
        say_progress(f"  {name} ...")
    else:
        calls = record.get("lm_calls", 0) + record.get("cached_lm_calls", 0)
        say_progress(
            f"  {name} done in {record['seconds']:.1f} s" + (f" ({calls} LM call{'s' * (calls != 1)})" if calls else "")
        )


def show_answer(fields: dict, options: dict[str, str], retriever, width: int = 100) -> None:
    """Print how a question was answered: hypothesis, queries, the shown passages (score, id, title, the
    queries that found each and its first words) and the answer.

    Args:
        fields: A prediction's fields or a run row (``answer`` or ``prediction``, ``valid``, ``error``,
            ``reasoning``, ``hypothesis``, ``queries``, ``query_sources``, ``query_roles``, ``passages``).
        options: The question's options.
        retriever: Resolves passage ids to their text (``None``: no snippets).
        width: Characters of each passage's text to print.
    """
    h = fields.get("hypothesis")
    if h:
        print("Hypothesis")
        print(f"  best option:         {h['working_hypothesis']}. {options.get(h['working_hypothesis'], '')}")
        print(f"  features:            {h['discriminating_features']}")
        print(f"  confirming evidence: {h['confirming_evidence']}")
        print(f"  reasoning:           {h['reasoning']}")
    roles = [r.replace("_", " ") for r in fields.get("query_roles") or []]
    sources = fields.get("query_sources") or []
    if fields.get("queries"):
        print("Queries")
        for i, q in enumerate(fields["queries"]):
            src = f" [{sources[i]}]" if i < len(sources) else ""
            role = f" {roles[i]}" if i < len(roles) else ""
            print(f"  q{i + 1}{role}{src}: {q}")
    passages = fields.get("passages") or []
    if passages:
        print(f"Passages ({len(passages)} shown to the answer step; score, id, title, found by)")
        for i, p in enumerate(passages, start=1):
            found_by = ",".join(f"q{q + 1}" for q in p.get("queries") or [])
            print(
                f"  [{i:>2}] {p.get('score', 0):8.3f}  {p['id']}  {p['title']}"
                + (f"  (found by {found_by})" if found_by else "")
            )
            if retriever is not None:
                text = " ".join(retriever.get(p["id"]).content.split())
                print(f"        {text[:width].rstrip()}{' ...' if len(text) > width else ''}")
    answer = fields.get("answer", fields.get("prediction"))
    print("Answer")
    if fields.get("valid"):
        print(f"  {answer}. {options[answer]}")
    else:
        print(f"  invalid reply ({fields.get('error')})")
    if fields.get("reasoning"):
        print(f"  reasoning: {fields['reasoning']}")


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``ask`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("ask", help="answer one question and show hypothesis, queries and passages")
    add_program_args(p)
    p.add_argument("--question", default=None, help="question text (default: none; or give --json)")
    p.add_argument("--option", action="append", help="an option as LETTER=text, repeated (default: none)")
    p.add_argument("--json", default=None, help="a JSON file holding {question, options} (default: none)")
    p.add_argument("--width", type=positive_int, default=100, help="characters of each passage to print")
    p.add_argument(
        "--mlflow-dir",
        default=None,
        help="MLflow store of --program runs:/ and models:/ URIs (default: $HCQR_MLFLOW_DIR or ./mlruns)",
    )
    add_lm_args(p)
    p.set_defaults(func=cmd_ask)
