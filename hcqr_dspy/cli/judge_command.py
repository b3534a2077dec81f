"""``hcqr judge``: label the retrieved context of each question of run folders with the DUR judge
(:mod:`hcqr_dspy.workflows.judge`), and with ``--labelled-set`` measure the judge on hand-labelled contexts
(:mod:`hcqr_dspy.judge.agreement`), with runs or alone.

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from hcqr_dspy.cli.common import (
    add_dataset_move_arg,
    add_endpoint_args,
    add_mlflow_args,
    id_list,
    move_datasets,
    positive_int,
    report_moves,
    undo_moves,
)
from hcqr_dspy.errors import HCQRError, RunError
from hcqr_dspy.lm import parse_lm_spec

# --labelled-set given without a PATH: the shipped set (hcqr_dspy.judge.agreement.default_labelled_set).
SHIPPED = "shipped"


def cmd_judge(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy and pydantic take seconds, `hcqr --help` none
    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.judge.agreement import AGREEMENT_FILE, default_labelled_set, load_labelled_set
    from hcqr_dspy.judge.run_judging import check_judge_index, judgeable
    from hcqr_dspy.workflows.judge import judge_and_track

    if args.seed is not None and args.limit is None:
        raise HCQRError("--seed draws the --limit sample: give --limit N with it")
    if args.mlflow_scorers is not None:
        return _judge_with_mlflow_scorers(args)
    if not args.runs and args.labelled_set is None:
        raise HCQRError("give run folders to judge, or --labelled-set to measure the judge on hand-labelled contexts")
    if not args.runs and args.judge_lm is None:
        raise HCQRError("--labelled-set without run folders needs --judge-lm (there is no run LM to default to)")
    if args.labelled_out is not None and args.labelled_set is None:
        raise HCQRError("--labelled-out writes the --labelled-set judgments: give --labelled-set with it")
    if args.dataset is not None and not args.runs:
        raise HCQRError("--dataset says where run folders' dataset lies now: give run folders with it")
    if args.judge_lm is not None:
        parse_lm_spec(args.judge_lm, api_base=args.api_base, api_key_env=args.api_key_env, option="--judge-lm")
    labelled = None
    if args.labelled_set is not None:  # read and resolved before any LM is loaded
        labelled = default_labelled_set() if args.labelled_set == SHIPPED else args.labelled_set
        load_labelled_set(labelled)
    if not args.runs:
        return _judge_labelled_only(args, labelled)
    moves = move_datasets(args.runs, args.dataset)
    try:
        for run_dir in args.runs:  # every run checked before any LM is loaded
            folder = RunFolder.open(run_dir)
            if not judgeable(folder):
                raise RunError(
                    f"{run_dir}: no question has a retrieved context (method {folder.method}): nothing to judge"
                )
            check_judge_index(folder, args.index)
    except HCQRError:
        undo_moves(moves)  # a refused command moves no dataset
        raise
    report_moves(moves)
    for run_dir in args.runs:
        metrics = judge_and_track(
            run_dir,
            judge_lm=args.judge_lm,
            index=args.index,
            mlflow_dir=args.mlflow_dir,
            track=not args.no_mlflow,
            num_threads=args.threads,
            limit=args.limit,
            seed=0 if args.seed is None else args.seed,
            ids=id_list(args.ids),
            labelled_set=labelled,
            **_judge_settings(args),
        )
        if metrics is not None:
            print(json.dumps({"run": str(run_dir), **metrics}))
            if args.labelled_out is not None:
                _write(args.labelled_out, RunFolder(run_dir).read_json(AGREEMENT_FILE))
    return 0


def _judge_with_mlflow_scorers(args: argparse.Namespace) -> int:
    """``hcqr judge RUN... --mlflow-scorers [NAMES]``: MLflow's retrieval judges on each run's traces
    (:func:`hcqr_dspy.workflows.mlflow_judges.judge_with_mlflow_scorers`); one JSON line per run."""
    from hcqr_dspy.judge.mlflow_record import scorer_names

    scorers = scorer_names(args.mlflow_scorers)
    if not args.runs:
        raise HCQRError("--mlflow-scorers judges run folders' traces: give run folders")
    for flag, given in (("--no-mlflow", args.no_mlflow), ("--labelled-set", args.labelled_set is not None)):
        if given:
            raise HCQRError(f"{flag} cannot go with --mlflow-scorers (MLflow's judges read and label MLflow traces)")
    if args.seed is not None and args.limit is None:
        raise HCQRError("--seed draws the --limit sample: give --limit N with it")
    if args.judge_lm is not None:
        parse_lm_spec(args.judge_lm, api_base=args.api_base, api_key_env=args.api_key_env, option="--judge-lm")
    from hcqr_dspy.workflows.mlflow_judges import judge_with_mlflow_scorers

    moves = move_datasets(args.runs, args.dataset)
    report_moves(moves)
    for done, run_dir in enumerate(args.runs):
        try:
            result = judge_with_mlflow_scorers(
                run_dir,
                scorers,
                judge_lm=args.judge_lm,
                api_base=args.api_base,
                api_key_env=args.api_key_env,
                mlflow_dir=args.mlflow_dir,
                limit=args.limit,
                seed=0 if args.seed is None else args.seed,
                ids=id_list(args.ids),
                n_ctx=args.n_ctx,
            )
        except HCQRError:
            if not done:
                undo_moves(moves)  # refused before any run was judged: no dataset moved
            raise
        print(json.dumps({"run": str(run_dir), **result}))
    return 0


def _judge_settings(args: argparse.Namespace) -> dict:
    """The judge's own settings from the flags: mode, reasoning, and its LM's tokens, window and endpoint."""
    return {
        "mode": args.mode,
        "reasoning": not args.no_reasoning,
        "max_tokens": args.max_tokens,
        "n_ctx": args.n_ctx,
        "api_base": args.api_base,
        "api_key_env": args.api_key_env,
    }


def _judge_labelled_only(args: argparse.Namespace, labelled) -> int:
    """``hcqr judge --labelled-set [PATH] --judge-lm SPEC`` without run folders: print the agreement."""
    from hcqr_dspy.judge.agreement import agreement_summary
    from hcqr_dspy.workflows.judge import judge_labelled

    record = judge_labelled(
        args.judge_lm,
        labelled,
        **_judge_settings(args),
    )
    if args.labelled_out is not None:
        _write(args.labelled_out, record)
    print(json.dumps(agreement_summary(record)))
    return 0


def _write(path: str, record: dict) -> None:
    """Write an agreement record (with each context's judgment) as JSON to ``path``."""
    try:
        Path(path).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise HCQRError(f"cannot write --labelled-out {path}: {exc.strerror or exc}") from None


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``judge`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("judge", help="label each run question's retrieved context with the DUR judge")
    p.add_argument("runs", nargs="*", help="run folders (from `hcqr eval`); none with --labelled-set alone")
    p.add_argument("--judge-lm", default=None, help="LM spec of the judge (default: the run's LM)")
    modes = ["context", "passage"]
    p.add_argument("--mode", choices=modes, default="context", help="judge the shown context (default) or each passage")
    p.add_argument(
        "--no-reasoning",
        action="store_true",
        help="the judge gives its label alone (default: it reasons first, as dspy.ChainOfThought)",
    )
    p.add_argument("--index", default=None, help="index folder (default: the run's)")
    add_dataset_move_arg(p)
    p.add_argument("--threads", type=positive_int, default=1, help="judgments in flight")
    sample = p.add_mutually_exclusive_group()
    sample.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        help="judge a seeded sample of N of the run's questions, drawn as `hcqr eval --limit` "
        "draws, so "
        "runs over the same questions are judged on the same ones (default: all)",
    )
    sample.add_argument("--ids", default=None, help="judge only these comma-separated question ids (default: all)")
    p.add_argument("--seed", type=int, default=None, help="seed of the --limit sample (default 0)")
    p.add_argument(
        "--labelled-set",
        nargs="?",
        const=SHIPPED,
        default=None,
        metavar="PATH",
        help="also judge hand-labelled contexts (default PATH: the shipped 40 over the demo data) with the same "
        "judge and record its agreement (accuracy, Cohen's kappa) in each run folder's judge_agreement.json; "
        "without run folders, print it (needs --judge-lm)",
    )
    p.add_argument(
        "--labelled-out",
        default=None,
        metavar="FILE",
        help="write the --labelled-set agreement with each context's judgment to FILE (JSON; with several run "
        "folders, the last one's)",
    )
    p.add_argument(
        "--mlflow-scorers",
        nargs="?",
        const="relevance,groundedness",
        default=None,
        metavar="NAMES",
        help="instead of DUR, run MLflow's built-in judges RetrievalRelevance and RetrievalGroundedness on each "
        "tracked run's question traces (NAMES: relevance, groundedness, comma-separated; default both) with the "
        "judge LM at an OpenAI-compatible endpoint; their feedback is logged on the traces, a trace judged already "
        "by the same judge LM is skipped",
    )
    add_mlflow_args(p)
    add_endpoint_args(p, who="the judge")
    p.add_argument("--max-tokens", type=positive_int, default=512, help="output tokens per judge call (default 512)")
    p.add_argument("--n-ctx", type=positive_int, default=8192, help="context window of a local judge (default 8192)")
    p.set_defaults(func=cmd_judge)
