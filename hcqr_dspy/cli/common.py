"""What the ``hcqr`` commands share: the names the parser offers, the help formatter, argument types and
argument groups, and the lines that name the MLflow store a command wrote to."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from hcqr_dspy.cli.method_names import method_names
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.retrieval.query_runtime import RUNTIMES
from hcqr_dspy.trace_levels import TRACE_LEVELS
from hcqr_dspy.tracking.store import store_dir, tracking_uri

log = logging.getLogger(__name__)

# The names the parser offers, written here so that `hcqr --help` imports neither the registries nor dspy
# (seconds of imports). tests/test_cli.py checks them against hcqr_dspy.retrieval.fusion.STRATEGIES, the
# hypothesis signatures and the retriever kinds. The method names are read from the programs' source files
# (hcqr_dspy.cli.method_names).
HYPOTHESIS_STYLES = ("features_first", "options_first")
FUSION_STRATEGIES = ("score_sum", "rrf", "round_robin")
RETRIEVER_KINDS = ("dense", "bm25", "hybrid")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help says its default: ``(default: X)`` is added unless the text already
    says what the default is; switches read ``(default: off)``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or action.required
            or "default" in text.lower()
            or action.default is argparse.SUPPRESS
            or isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        ):
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        if action.default is None:
            return f"{text} (default: none)"
        return f"{text} (default: %(default)s)"


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def id_list(text: str | None) -> list[str] | None:
    """``--ids a,b,c`` as a list (spaces around ids dropped); ``None`` when the flag is absent."""
    return None if text is None else [i.strip() for i in text.split(",") if i.strip()]


def move_datasets(runs: list[str], dataset: str | None) -> list[tuple[object, str]]:
    """``--dataset``: each run folder's questions are read from ``dataset`` from now on, once every folder's are
    checked to be that run's own (:func:`~hcqr_dspy.evaluation.run_questions.move_dataset`); nothing is
    written if one is not. Returns ``(folder, place before)`` per folder moved, for :func:`undo_moves` when the
    command is refused later and :func:`report_moves` when it goes on.

    Raises:
        HCQRError: an empty path; a run whose questions are not there (no folder moved).
    """
    if dataset is None:
        return []
    if not dataset.strip():
        raise HCQRError("--dataset needs the path of the runs' dataset")
    if Path(dataset).is_dir():
        raise HCQRError(f"--dataset {dataset} is a folder: give the runs' question file")
    from hcqr_dspy.evaluation.run_folder import RunFolder  # reads run records: loaded only when asked
    from hcqr_dspy.evaluation.run_questions import move_dataset, reload_questions

    folders = list({Path(run).resolve(): RunFolder.open(run) for run in runs}.values())
    place = str(Path(dataset).resolve()) if Path(dataset).exists() else dataset
    for folder in folders:  # every run checked before any is written
        if folder.dataset != place:
            reload_questions(folder, place)
    moves = []
    try:
        for folder in folders:
            before = move_dataset(folder, dataset, check=False)
            if before is not None:
                moves.append((folder, before))
    except HCQRError:
        undo_moves(moves)
        raise
    return moves


def undo_moves(moves: list[tuple[object, str]]) -> None:
    """Put back the dataset places :func:`move_datasets` replaced (the command was refused after it)."""
    from hcqr_dspy.evaluation.run_questions import move_dataset

    for folder, before in moves:
        move_dataset(folder, before, check=False)


def report_moves(moves: list[tuple[object, str]]) -> None:
    """One stderr line per run folder whose dataset place :func:`move_datasets` changed."""
    for folder, before in moves:
        log.info(f"{folder.path}: its questions are read from {folder.dataset} now (recorded: {before})")


def add_dataset_move_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dataset",
        default=None,
        help="where the runs' dataset lies now, if it moved since they ran (another machine or data mount); "
        "checked against each run's recorded question fingerprint, then recorded in its config.json",
    )


def say_progress(message: str) -> None:
    """A line saying what the command is doing: an INFO record, on stderr (:mod:`hcqr_dspy.cli.logs`; hidden by
    ``-q``); stdout keeps the result."""
    log.info(message)


# -- search options ------------------------------------------------------------


def parsed_search_options(args: argparse.Namespace) -> dict:
    return {
        k: v
        for k, v in (("nprobe", args.nprobe), ("efSearch", args.ef_search), ("k_factor", args.k_factor))
        if v is not None
    }


def add_search_option_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nprobe",
        type=positive_int,
        default=None,
        help="dense indexes of faiss IVF types: inverted lists visited per query (default: faiss's, 1)",
    )
    p.add_argument(
        "--ef-search",
        type=positive_int,
        default=None,
        help="dense indexes of faiss HNSW types: candidate list size per query (default: faiss's, 16)",
    )
    p.add_argument(
        "--k-factor",
        type=positive_int,
        default=None,
        help="dense indexes of faiss refine types (IVF...,PQ...,RFlat): candidates re-scored exactly per "
        "hit wanted (default: faiss's, 1)",
    )
    add_encoder_backend_arg(p)


def add_encoder_backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--encoder-backend",
        choices=RUNTIMES,
        default=None,
        help="what embeds the queries of a dense or hybrid index: torch (default; sentence-transformers), "
        "onnx, onnx-int8 (ONNX Runtime), openvino or openvino-bf16 (bf16 CPUs), exported once "
        "from the index's own query encoder into the cache (passages stay PyTorch's; "
        "see bench/RESULTS.md for agreement)",
    )


# -- LM, MLflow, program and evaluation options ----------------------------------


def add_mlflow_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.add_argument("--no-mlflow", action="store_true", help="do not track in MLflow")


def add_endpoint_args(p: argparse.ArgumentParser, prefix: str = "", who: str = "the LM") -> None:
    """``--{prefix}api-base`` and ``--{prefix}api-key-env``: where a LiteLLM model is served and its key's variable."""
    p.add_argument(f"--{prefix}api-base", default=None, help=f"API base URL of {who} (default: the provider's)")
    p.add_argument(
        f"--{prefix}api-key-env",
        default=None,
        help=f"name of the environment variable holding {who}'s API key, never the key itself (default: none)",
    )


def add_lm_args(p: argparse.ArgumentParser, default: str = "local") -> None:
    p.add_argument("--lm", default=default, help="LM spec: local, local:<name>, gguf:<path> or a LiteLLM model name")
    add_endpoint_args(p)
    p.add_argument("--max-tokens", type=positive_int, default=1024, help="output tokens per LM call")
    p.add_argument(
        "--n-ctx",
        type=positive_int,
        default=8192,
        help="context window of local models (at most the one the model was trained with)",
    )


def parsed_program_options(args: argparse.Namespace) -> dict:
    """The method options given as flags (``--budget``, ``--k-per-query``, ``--fusion``); flags left out
    are absent, so the method's own documented defaults apply (HCQR: ``k_per_query = ceil(budget / roles)``)."""
    flags = {
        "budget": args.budget,
        "k_per_query": args.k_per_query,
        "fusion": args.fusion,
        "hypothesis_style": getattr(args, "hypothesis_style", None),
    }
    return {k: v for k, v in flags.items() if v is not None}


def add_run_args(p: argparse.ArgumentParser, verb: str) -> None:
    """Question selection, parallelism, run folder, MLflow and LM options shared by ``eval`` and ``predict``."""
    p.add_argument(
        "--limit", type=positive_int, default=None, help=f"{verb} a seeded random sample of N questions (default: all)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the --limit sample")
    p.add_argument("--ids", default=None, help="comma-separated question ids (default: all)")
    p.add_argument("--threads", type=positive_int, default=1, help="questions in flight (1 for local models)")
    p.add_argument("--run-dir", default=None, help="run folder (default: derived from the configuration)")
    add_mlflow_args(p)
    p.add_argument(
        "--traces",
        choices=TRACE_LEVELS,
        default=None,
        help="what each question's MLflow trace keeps: full (each LM call's messages and reply, passage texts), light "
        "(hcqr's own spans: question, stages, retrieval, answer; texts cut, no prompts or passage texts) or off (no "
        "traces, none scored; params, metrics and run files still tracked); store bytes a question for each in "
        "docs/runs.md (default: $HCQR_TRACES, else full)",
    )
    add_lm_args(p)


def add_program_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--method",
        default=None,
        metavar="METHOD",
        help=f"one of: {', '.join(method_names())} (default: hcqr, or the saved program's)",
    )
    p.add_argument(
        "--program",
        default=None,
        help="a saved program to run instead of a fresh method: a folder from `hcqr compile`, "
        "runs:/<mlflow run id>, models:/NAME/VERSION or models:/NAME@ALIAS (MLflow Model Registry); "
        "its method and options come with it (default: none, run --method zero-shot)",
    )
    p.add_argument(
        "--index", default=None, help="index folder (from `hcqr index`; default: none, needed by retrieval methods)"
    )
    p.add_argument(
        "--budget",
        type=positive_int,
        default=None,
        help="passages shown to the answer step (default: the method's, 15 as in the paper)",
    )
    p.add_argument(
        "--k-per-query",
        type=positive_int,
        default=None,
        help="passages per query, HCQR and its ablations (default: ceil(budget / queries), 5 for HCQR)",
    )
    p.add_argument(
        "--fusion",
        choices=FUSION_STRATEGIES,
        default=None,
        help="multi-query fusion of HCQR, its ablations and query_rewrite (default: score_sum)",
    )
    p.add_argument(
        "--hypothesis-style",
        choices=HYPOTHESIS_STYLES,
        default=None,
        help="HCQR's hypothesis step: features_first (the paper's field order) or options_first "
        "(review each option, then commit) (default: features_first)",
    )
    add_search_option_args(p)


# -- where the results went --------------------------------------------------------


def tracking_store(args) -> str:
    return tracking_uri(getattr(args, "mlflow_dir", None))


def ui_hint(args) -> str:
    """The command that opens the UI on the store this command wrote to."""
    mlflow_dir = getattr(args, "mlflow_dir", None)
    external = os.environ.get("MLFLOW_TRACKING_URI")
    # (MLflow sets the variable itself to the store hcqr configured: that one is ours)
    if external and mlflow_dir is None and external != f"sqlite:///{store_dir(None) / 'mlflow.db'}":
        return f"the MLflow UI of {external}"
    if mlflow_dir is None or store_dir(mlflow_dir) == store_dir(None):
        return "`hcqr ui`"
    return f"`hcqr ui --mlflow-dir {store_dir(mlflow_dir)}`"
