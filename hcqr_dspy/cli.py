"""The ``hcqr`` command line.

Every subcommand prints a one-line ``hcqr: error: ...`` message and exits with
code 2 on bad input (:class:`hcqr_dspy.errors.HCQRError`), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from hcqr_dspy import __version__
from hcqr_dspy.errors import HCQRError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

Command = Callable[[argparse.Namespace], int]

# The names the parser offers, written here so that `hcqr --help` imports neither the method
# registry nor the retrieval package (dspy, torch, faiss: seconds of imports). tests/test_cli.py
# checks them against hcqr_dspy.programs.PROGRAMS and hcqr_dspy.retrieval.fusion.STRATEGIES.
METHODS = ("cot", "simple_rag", "hcqr", "hyde", "query_rewrite", "query_rewrite_options", "rerank_rag", "main_rag",
           "hcqr_no_support", "hcqr_no_distinction", "hcqr_no_key_features", "hcqr_show_hypothesis", "hcqr_hypothesis")
HYPOTHESIS_STYLES = ("features_first", "options_first")
FUSION_STRATEGIES = ("score_sum", "rrf", "round_robin")
RETRIEVER_KINDS = ("dense", "bm25", "hybrid")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help says its default: ``(default: X)`` is added unless the text already
    says what the default is; switches read ``(default: off)``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.required or "default" in text.lower() or action.default is argparse.SUPPRESS
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        if action.default is None:
            return f"{text} (default: none)"
        return f"{text} (default: %(default)s)"


def _versions() -> str:
    """``hcqr-dspy X (dspy Y, mlflow Z, python W)``, read from installed package metadata (no import)."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "missing"

    return (f"hcqr-dspy {__version__} (dspy {version('dspy')}, mlflow {version('mlflow')}, "
            f"python {sys.version.split()[0]})")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


# -- index / search ----------------------------------------------------------
def _milvus_settings(args: argparse.Namespace):
    """The Milvus settings of `hcqr index` (checked, nothing contacted), or None for faiss/bm25s files.

    Raises:
        HCQRError: Milvus flags without --backend milvus, faiss flags with it, or bad Milvus settings.
    """
    from hcqr_dspy.retrieval.milvus import MilvusSettings, parse_params

    given = [flag for flag, value in (("--milvus-uri", args.milvus_uri), ("--collection", args.collection),
                                      ("--milvus-index", args.milvus_index),
                                      ("--milvus-index-param", args.milvus_index_param),
                                      ("--milvus-search-param", args.milvus_search_param),
                                      ("--milvus-token-env", args.milvus_token_env),
                                      ("--milvus-index-timeout", args.milvus_index_timeout)) if value]
    if args.backend != "milvus":
        if given:
            raise HCQRError(f"{', '.join(given)} only apply with --backend milvus")
        return None
    faiss_flags = [f for f, v in (("--faiss", args.faiss), ("--train-size", args.train_size)) if v is not None]
    if faiss_flags:
        raise HCQRError(f"{', '.join(faiss_flags)} apply to the faiss backend, not --backend milvus (see --milvus-index)")
    if not args.milvus_uri or not args.collection:
        raise HCQRError("--backend milvus needs --milvus-uri (a Milvus Lite .db path or http://host:port) and --collection")
    return MilvusSettings(
        uri=args.milvus_uri, collection=args.collection, retrieval=args.retriever,
        index_type=args.milvus_index or "FLAT",
        index_params=parse_params(args.milvus_index_param, "--milvus-index-param"),
        search_params=parse_params(args.milvus_search_param, "--milvus-search-param"),
        token_env=args.milvus_token_env, index_timeout=args.milvus_index_timeout or 3600.0,
    )


def cmd_index(args: argparse.Namespace) -> int:
    import shutil

    from hcqr_dspy.retrieval import build_retriever, load_corpus, load_encoder
    from hcqr_dspy.retrieval.base import check_index_target
    from hcqr_dspy.retrieval.vector_index import FaissIndex

    milvus = _milvus_settings(args)  # bad Milvus flags fail here, before anything is read or contacted
    out = check_index_target(args.out)  # fail before minutes of encoding, not after
    dense = args.retriever != "bm25"
    if not dense:
        given = [flag for flag, value in (("--encoder", args.encoder), ("--faiss", args.faiss), ("--train-size", args.train_size),
                                          ("--embeddings", args.embeddings)) if value is not None]
        if given:
            raise HCQRError(f"{', '.join(given)} apply to dense and hybrid indexes, not --retriever bm25")
    encoder = None
    options: dict = {}
    if dense:
        encoder = load_encoder(args.encoder)  # a missing model fails here, before the corpus is read
        options = {"batch_size": args.batch_size, "chunk_size": args.chunk_size, "embeddings_dir": args.embeddings}
        if milvus is None:
            backend_options = {"factory": args.faiss or "Flat", **({"train_size": args.train_size} if args.train_size else {})}
            FaissIndex.check_settings(encoder.dimension, **backend_options)
            options["backend_options"] = backend_options
        elif args.retriever == "dense":
            options.update(backend="milvus", backend_options=milvus.options())
    staging = out.parent / f".{out.name}.corpus"  # the passage store, hard-linked into the index when it is saved
    try:
        t0 = time.perf_counter()
        corpus = load_corpus(args.corpus, duplicate_ids=args.duplicate_ids, store=staging)
        t_load = time.perf_counter() - t0
        renamed = f" ({corpus.renamed} repeated ids renamed <id>#N)" if corpus.renamed else ""
        print(f"loaded {len(corpus)} passages from {corpus.source} in {t_load:.1f}s{renamed}", file=sys.stderr)
        t0 = time.perf_counter()
        if milvus is not None and args.retriever != "dense":
            from hcqr_dspy.retrieval.milvus import MilvusRetriever

            retriever = MilvusRetriever(corpus, milvus, encoder=encoder, show_progress=True, **options)
        else:
            retriever = build_retriever(corpus, args.retriever, encoder=encoder, **options)
        t_build = time.perf_counter() - t0
        out = retriever.save(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    summary = {
        "index": str(out),
        "retriever": args.retriever,
        "backend": args.backend,
        "passages": len(corpus),
        "build_seconds": round(t_build, 2),
        "passages_per_second": round(len(corpus) / t_build, 1),
        "size_bytes": size,
    }
    dense_part = next((r for r in [retriever, *getattr(retriever, "retrievers", [])] if r.kind == "dense"), None)
    if dense_part is not None:
        summary.update(encoder=dense_part.encoder_name, **dense_part.build_stats)
        if milvus is None:
            summary["faiss"] = dense_part.index.describe().get("factory")
    if retriever.kind == "milvus":
        summary.update(encoder=retriever.encoder_name, **retriever.build_stats)
    print(json.dumps(summary))
    return 0


def _search_options(args: argparse.Namespace) -> dict:
    return {k: v for k, v in (("nprobe", args.nprobe), ("efSearch", args.ef_search), ("k_factor", args.k_factor))
            if v is not None}


def _add_search_option_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nprobe", type=_positive_int, default=None,
                   help="dense indexes of faiss IVF types: inverted lists visited per query (default: faiss's, 1)")
    p.add_argument("--ef-search", type=_positive_int, default=None,
                   help="dense indexes of faiss HNSW types: candidate list size per query (default: faiss's, 16)")
    p.add_argument("--k-factor", type=_positive_int, default=None,
                   help="dense indexes of faiss refine types (IVF...,PQ...,RFlat): candidates re-scored exactly per "
                        "hit wanted (default: faiss's, 1)")
    _add_encoder_backend_arg(p)


def _add_encoder_backend_arg(p: argparse.ArgumentParser) -> None:
    from hcqr_dspy.retrieval.query_runtime import RUNTIMES

    p.add_argument("--encoder-backend", choices=RUNTIMES, default=None,
                   help="what embeds the queries of a dense or hybrid index: torch (default; sentence-transformers), "
                        "onnx, onnx-int8 (ONNX Runtime), openvino or openvino-bf16 (bf16 CPUs), exported once "
                        "from the index's own query encoder into the cache (passages stay PyTorch's; see bench/RESULTS.md for agreement)")


def cmd_search(args: argparse.Namespace) -> int:
    from hcqr_dspy.retrieval import load_index

    retriever = load_index(args.index, corpus=args.corpus, encoder=args.encoder, search_options=_search_options(args),
                           encoder_backend=args.encoder_backend)
    results = retriever.search(args.queries, args.k)
    for query, hits in zip(args.queries, results):
        print(f"## {query}")
        if not hits:
            print("   (no passage matched)")
        for rank, hit in enumerate(hits, start=1):
            p = retriever.get(hit.passage_id)
            snippet = " ".join(p.content.split())[: args.width]
            print(f"{rank:>3}  {hit.score:8.4f}  [{p.id}] {p.title}\n       {snippet}")
    return 0


# -- eval / ask / demo / ui --------------------------------------------------
def _add_mlflow_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.add_argument("--no-mlflow", action="store_true", help="do not track in MLflow")


def _add_lm_args(p: argparse.ArgumentParser, default: str = "local") -> None:
    p.add_argument("--lm", default=default, help="LM spec: local, local:<name>, gguf:<path> or a LiteLLM model name")
    p.add_argument("--api-base", default=None, help="API base URL of a LiteLLM model (default: the provider's)")
    p.add_argument("--api-key-env", default=None,
                   help="name of the environment variable holding the API key, never the key itself (default: none)")
    p.add_argument("--max-tokens", type=_positive_int, default=1024, help="output tokens per LM call")
    p.add_argument("--n-ctx", type=_positive_int, default=8192, help="context window of local models")


def _program_options(args: argparse.Namespace) -> dict:
    """The method options given as flags (``--budget``, ``--k-per-query``, ``--fusion``); flags left out
    are absent, so the method's own documented defaults apply (HCQR: ``k_per_query = ceil(budget / roles)``)."""
    flags = {"budget": args.budget, "k_per_query": args.k_per_query, "fusion": args.fusion,
             "hypothesis_style": getattr(args, "hypothesis_style", None)}
    return {k: v for k, v in flags.items() if v is not None}


def _id_list(text: str | None) -> list[str] | None:
    """``--ids a,b,c`` as a list (spaces around ids dropped); ``None`` when the flag is absent."""
    return None if text is None else [i.strip() for i in text.split(",") if i.strip()]


def _add_run_args(p: argparse.ArgumentParser, verb: str) -> None:
    """Question selection, parallelism, run folder, MLflow and LM options shared by ``eval`` and ``predict``."""
    p.add_argument("--limit", type=_positive_int, default=None, help=f"{verb} a seeded random sample of N questions (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --limit sample")
    p.add_argument("--ids", default=None, help="comma-separated question ids (default: all)")
    p.add_argument("--threads", type=_positive_int, default=1, help="questions in flight (1 for local models)")
    p.add_argument("--run-dir", default=None, help="run folder (default: derived from the configuration)")
    _add_mlflow_args(p)
    _add_lm_args(p)


def _add_program_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default=None, metavar="METHOD",
                   help=f"one of: {', '.join(METHODS)} (default: hcqr, or the saved program's)")
    p.add_argument("--program", default=None,
                   help="a saved program to run instead of a fresh method: a folder from `hcqr compile`, "
                        "runs:/<mlflow run id>, models:/NAME/VERSION or models:/NAME@ALIAS (MLflow Model Registry); "
                        "its method and options come with it (default: none, run --method zero-shot)")
    p.add_argument("--index", default=None, help="index folder (from `hcqr index`; default: none, needed by retrieval methods)")
    p.add_argument("--budget", type=_positive_int, default=None,
                   help="passages shown to the answer step (default: the method's, 15 as in the paper)")
    p.add_argument("--k-per-query", type=_positive_int, default=None,
                   help="passages per query, HCQR and its ablations (default: ceil(budget / queries), 5 for HCQR)")
    p.add_argument("--fusion", choices=FUSION_STRATEGIES, default=None,
                   help="multi-query fusion of HCQR, its ablations and query_rewrite (default: score_sum)")
    p.add_argument("--hypothesis-style", choices=HYPOTHESIS_STYLES, default=None,
                   help="HCQR's hypothesis step: features_first (the paper's field order) or options_first "
                        "(review each option, then commit) (default: features_first)")
    _add_search_option_args(p)


def cmd_eval(args: argparse.Namespace) -> int:
    from hcqr_dspy.compare import metrics_table
    from hcqr_dspy.run import EvalSpec, run_evaluation

    spec = EvalSpec(
        method=args.method if args.program else (args.method or "hcqr"), dataset=args.dataset, index=args.index,
        lm=args.lm, limit=args.limit, seed=args.seed,
        ids=_id_list(args.ids), program_options=_program_options(args),
        max_tokens=args.max_tokens, n_ctx=args.n_ctx, api_base=args.api_base, api_key_env=args.api_key_env,
        num_threads=args.threads, run_dir=args.run_dir, program=args.program, search_options=_search_options(args),
        encoder_backend=args.encoder_backend,
    )
    result, run_dir, run_id = run_evaluation(spec, mlflow_dir=args.mlflow_dir, track=not args.no_mlflow)
    print(metrics_table([(spec.method + (f" ({args.program})" if args.program else ""), result.metrics)]))
    print(f"\n{result.ran} questions run now, {result.resumed} resumed from {run_dir / 'predictions.jsonl'}")
    if run_id:
        print(f"MLflow run {run_id} in {_store(args)} (view with {_ui_hint(args)})")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from hcqr_dspy.compare import metrics_table
    from hcqr_dspy.data import load_questions, select
    from hcqr_dspy.run import EvalSpec, answers_target, run_evaluation, write_answers

    out = answers_target(args.out)
    spec = EvalSpec(
        method=args.method if args.program else (args.method or "hcqr"), dataset=args.input, index=args.index,
        lm=args.lm, limit=args.limit, seed=args.seed, ids=_id_list(args.ids),
        program_options=_program_options(args), max_tokens=args.max_tokens, n_ctx=args.n_ctx, api_base=args.api_base,
        api_key_env=args.api_key_env, num_threads=args.threads, run_dir=args.run_dir, program=args.program,
        search_options=_search_options(args), encoder_backend=args.encoder_backend, labelled=False,
    )
    result, run_dir, run_id = run_evaluation(spec, mlflow_dir=args.mlflow_dir, track=not args.no_mlflow)
    questions = select(load_questions(args.input, labelled=False), limit=args.limit, seed=args.seed, ids=spec.ids)
    write_answers(out, result.rows, questions)
    print(metrics_table([(spec.method + (f" ({args.program})" if args.program else ""), result.metrics)]))
    scored = "accuracy" in result.metrics
    print(f"\n{len(result.rows)} answers written to {out}" + (" (with gold answers: scored)" if scored else "")
          + f"; {result.ran} questions run now, {result.resumed} resumed from {run_dir / 'predictions.jsonl'}")
    if run_id:
        print(f"MLflow run {run_id} in {_store(args)} (view with {_ui_hint(args)})")
    return 0


def _store(args) -> str:
    from hcqr_dspy.tracking import tracking_uri

    return tracking_uri(getattr(args, "mlflow_dir", None))


def _ui_hint(args) -> str:
    """The command that opens the UI on the store this command wrote to."""
    from hcqr_dspy.tracking import store_dir

    mlflow_dir = getattr(args, "mlflow_dir", None)
    external = os.environ.get("MLFLOW_TRACKING_URI")
    # (MLflow sets the variable itself to the store hcqr configured: that one is ours)
    if external and mlflow_dir is None and external != f"sqlite:///{store_dir(None) / 'mlflow.db'}":
        return f"the MLflow UI of {external}"
    if mlflow_dir is None or store_dir(mlflow_dir) == store_dir(None):
        return "`hcqr ui`"
    return f"`hcqr ui --mlflow-dir {store_dir(mlflow_dir)}`"


def _read_question(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    from hcqr_dspy.data import DataError, check_question

    if args.json:
        from hcqr_dspy.config import read_json

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
    import dspy

    from hcqr_dspy.evaluate import LM_UNAVAILABLE, lm_failure
    from hcqr_dspy.lm import build_lm, check_lm, parse_lm_spec
    from hcqr_dspy.programs import PROGRAMS, make_program
    from hcqr_dspy.programs.base import observe_stages
    from hcqr_dspy.program_io import load_program, read_meta, resolve_program_path
    from hcqr_dspy.retrieval import load_index
    from hcqr_dspy.run import check_program_options

    question, options = _read_question(args)
    parse_lm_spec(args.lm, api_base=args.api_base, api_key_env=args.api_key_env)
    folder = None
    method = args.method or "hcqr"
    if args.program:
        folder = resolve_program_path(args.program, getattr(args, "mlflow_dir", None))
        meta = read_meta(folder)
        if args.method and args.method != meta["method"]:
            raise HCQRError(f"{args.program} is a saved {meta['method']!r} program, not {args.method!r}")
        method = meta["method"]
        if _program_options(args):
            raise HCQRError(f"{args.program} is a saved program: its options come with it; drop "
                            + ", ".join("--" + k.replace("_", "-") for k in sorted(_program_options(args))))
    if method not in PROGRAMS:
        raise HCQRError(f"unknown method {method!r}; choose one of {', '.join(PROGRAMS)}")
    check_program_options(method, _program_options(args))
    retriever = None
    if PROGRAMS[method].uses_retrieval:
        if not args.index:
            raise HCQRError(f"method {method!r} needs --index (build one with `hcqr index`)")
        t0 = time.perf_counter()
        _progress(f"loading the index {args.index} ...")
        retriever = load_index(args.index, search_options=_search_options(args), encoder_backend=args.encoder_backend)
        _progress(f"  {len(retriever.corpus)} passages ({retriever.kind}) in {time.perf_counter() - t0:.1f} s")
    elif args.encoder_backend not in (None, "torch"):
        raise HCQRError(f"method {method!r} retrieves nothing: --encoder-backend does not apply")
    if folder is not None:
        program, meta = load_program(folder, retriever)
        print(f"Program: saved {method} from {args.program} (optimizer {meta.get('optimizer') or 'none'})")
    else:
        try:
            program = make_program(method, retriever, **_program_options(args))
        except ValueError as exc:
            raise HCQRError(f"method {method!r}: {exc}") from None
    t0 = time.perf_counter()
    _progress(f"loading the model {args.lm} ...")
    lm = build_lm(args.lm, max_tokens=args.max_tokens, n_ctx=args.n_ctx, api_base=args.api_base, api_key_env=args.api_key_env)
    check_lm(lm)
    _progress(f"  ready in {time.perf_counter() - t0:.1f} s; answering with {method}")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()), observe_stages(_stage_progress):
        try:
            pred = program(question=question, options=options)
        except LM_UNAVAILABLE as exc:
            raise HCQRError(f"the LM stopped answering or cannot be used ({lm_failure(exc)}); nothing was answered") from None
    _show_answer({**pred.toDict(), "answer": pred.answer}, options, retriever, args.width)
    return 0 if pred.valid else 1


def _progress(message: str) -> None:
    """A line saying what the command is doing, on stderr (stdout keeps the result)."""
    print(message, file=sys.stderr, flush=True)


def _stage_progress(name: str, record: dict | None) -> None:
    """Print a program stage as it starts and ends (:func:`hcqr_dspy.programs.base.observe_stages`)."""
    if record is None:
        _progress(f"  {name} ...")
    else:
        calls = record.get("lm_calls", 0) + record.get("cached_lm_calls", 0)
        _progress(f"  {name} done in {record['seconds']:.1f} s" + (f" ({calls} LM call{'s' * (calls != 1)})" if calls else ""))


def _show_answer(fields: dict, options: dict[str, str], retriever, width: int = 100) -> None:
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
            print(f"  [{i:>2}] {p.get('score', 0):8.3f}  {p['id']}  {p['title']}" + (f"  (found by {found_by})" if found_by else ""))
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


def cmd_demo(args: argparse.Namespace) -> int:
    from hcqr_dspy.compare import compare, metrics_table, track_comparison
    from hcqr_dspy.data import load_questions, select
    from hcqr_dspy.errors import RetrievalIndexError
    from hcqr_dspy.resources import shipped_dir
    from hcqr_dspy.retrieval import build_retriever, load_corpus, load_index
    from hcqr_dspy.run import EvalSpec, run_evaluation
    from hcqr_dspy.run_folder import RunFolder

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
        _progress(f"\n== {method} on {len(questions)} demo questions with --lm {args.lm}"
                  + (f" ({len(earlier)} already answered)" if earlier else ""))
        if method == "hcqr" and earlier and not shown["done"]:
            show_first(earlier[0])

        def on_row(row: dict, method: str = method, tally: dict = tally) -> None:
            tally["done"] += 1
            tally["right"] += bool(row["correct"])
            mark = "right" if row["correct"] else ("invalid" if not row["valid"] else "wrong")
            _progress(f"  {method:<11} {tally['done']:>2}/{len(questions)}  {row['qid']}: {row['prediction'] or '-'} "
                      f"(gold {row['gold']}, {mark}, {row['seconds']:.0f} s)   accuracy so far "
                      f"{tally['right']}/{tally['done']} = {tally['right'] / tally['done']:.0%}")
            if method == "hcqr" and not shown["done"]:
                show_first(row)

        spec = EvalSpec(method=method, dataset=str(dataset), index=str(index), lm=args.lm, limit=args.limit,
                        max_tokens=args.max_tokens, run_dir=str(run_dir))
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
        print(f"\nComparison: {files[0]} (plots beside it, accuracy_vs_cost.png among them; MLflow run {comparison_id})")
    else:
        print(metrics_table(results))
    print(f"\nRuns: {args.runs}/ · MLflow store: {_store(args)} · view with {_ui_hint(args)} (http://127.0.0.1:5000)")
    return 0


def cmd_judge(args: argparse.Namespace) -> int:
    from hcqr_dspy.dur import check_judge_index, judge_and_track, judgeable
    from hcqr_dspy.lm import parse_lm_spec
    from hcqr_dspy.run_folder import RunError, RunFolder

    if args.seed is not None and args.limit is None:
        raise HCQRError("--seed draws the --limit sample: give --limit N with it")
    if args.judge_lm is not None:
        parse_lm_spec(args.judge_lm, api_base=args.api_base, api_key_env=args.api_key_env, option="--judge-lm")
    for run_dir in args.runs:  # every run checked before any LM is loaded
        folder = RunFolder.open(run_dir)
        if not judgeable(folder):
            raise RunError(f"{run_dir}: no question has a retrieved context (method {folder.method}): nothing to judge")
        check_judge_index(folder, args.index)
    for run_dir in args.runs:
        metrics = judge_and_track(
            run_dir, judge_lm=args.judge_lm, mode=args.mode, reasoning=not args.no_reasoning, index=args.index,
            mlflow_dir=args.mlflow_dir, track=not args.no_mlflow, num_threads=args.threads,
            max_tokens=args.max_tokens, n_ctx=args.n_ctx, api_base=args.api_base, api_key_env=args.api_key_env,
            limit=args.limit, seed=0 if args.seed is None else args.seed, ids=_id_list(args.ids),
        )
        if metrics is not None:
            print(json.dumps({"run": str(run_dir), **metrics}))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from hcqr_dspy.compare import compare, track_comparison

    report, files = compare(args.runs, reference=args.reference, out_dir=args.out, qrels=args.qrels,
                            common=args.common)
    print(report)
    print(f"written: {', '.join(str(f) for f in files)}", file=sys.stderr)
    if not args.no_mlflow:
        run_id = track_comparison(args.out, mlflow_dir=args.mlflow_dir)
        print(f"MLflow run {run_id} in {_store(args)} (view with {_ui_hint(args)})", file=sys.stderr)
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from hcqr_dspy.compare import metrics_table
    from hcqr_dspy.experiment import ExperimentError, load_experiment, run_experiment

    only = [d.strip() for d in args.datasets.split(",") if d.strip()] if args.datasets is not None else None
    try:
        exp = load_experiment(args.file, limit=args.limit, lm=args.lm, only_datasets=only,
                              encoder_backend=args.encoder_backend)
    except ExperimentError as exc:
        if not args.check:
            raise  # a run stops on one line: the first problem and how many more
        for problem in exc.problems:  # --check: every problem, one line each
            print(f"hcqr: error: {problem}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.file}: valid ({len(exp.datasets)} dataset(s) x {len(exp.methods)} method(s), lm {exp.lm})")
        return 0
    out = run_experiment(exp, runs_root=args.runs, mlflow_dir=args.mlflow_dir)
    for dname, cells in out["cells"].items():
        print(f"\n## {dname}\n")
        print(metrics_table(list(cells.items())))
        if dname in out["reports"]:
            print(f"\nreport: {out['reports'][dname]}")
    print(f"\nMLflow parent run {out['parent_run_id']} in {_store(args)} (view with {_ui_hint(args)})")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from hcqr_dspy.optimize import CompileSpec, run_compile

    from hcqr_dspy.programs import PROGRAMS
    from hcqr_dspy.run import check_program_options

    options = _program_options(args)
    if args.program in PROGRAMS:
        check_program_options(args.program, options)
    spec = CompileSpec(
        recipe=args.recipe, method=args.program, train=args.train, index=args.index, out=args.out, lm=args.lm,
        reflection_lm=args.reflection_lm, reflection_api_base=args.reflection_api_base,
        reflection_api_key_env=args.reflection_api_key_env, train_size=args.train_size, val_size=args.val_size,
        holdout=list(args.holdout or []), program_options=options, max_tokens=args.max_tokens, n_ctx=args.n_ctx,
        api_base=args.api_base, api_key_env=args.api_key_env, register=args.register, alias=args.alias,
    )
    out = run_compile(spec, mlflow_dir=args.mlflow_dir, track=not args.no_mlflow)
    print(f"saved compiled {args.program} to {out['out']} ({out['train']} training + {out['val']} validation questions)")
    for name, info in out["predictors"].items():
        changed = "changed" if info["instructions_changed"] else "unchanged"
        print(f"  {name}: {info['demos']} demos, instructions {changed}")
    if out["scores"].get("val_score") is not None:
        print(f"  the optimizer's validation score: {out['scores']['val_score']:.1%}")
    if out["mlflow_run_id"]:
        print(f"MLflow run {out['mlflow_run_id']} in {_store(args)} (view with {_ui_hint(args)}); run it with "
              f"`hcqr eval --program {out['out']}` or --program runs:/{out['mlflow_run_id']}")
    if out["registered"]:
        from hcqr_dspy.serving import SERVE_TIMEOUT_S

        uri = f"models:/{args.register}@{args.alias}" if args.alias else out["registered"]
        print(f"registered as {out['registered']}" + (f" (alias {args.alias})" if args.alias else "")
              + f": `hcqr eval --program {uri}`, `hcqr predict --program {uri}`, or serve it with\n"
              f"  MLFLOW_TRACKING_URI={_store(args)} mlflow models serve -m {uri} --env-manager local -h 127.0.0.1 -p 5001 "
              f"-t {SERVE_TIMEOUT_S}\n  (-t: seconds a request may take; MLflow's default, 60, is shorter than one question "
              "with a local model on a CPU)")
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from hcqr_dspy.tracking import check_port, configure, key_metrics_url, serve_ui, store_dir

    folder = store_dir(args.mlflow_dir)
    if not (folder / "mlflow.db").exists():
        raise HCQRError(f"no MLflow store at {folder} yet; run `hcqr eval` or `make demo` first")
    check_port(args.host, args.port)  # a taken port fails here, before a link to another program is printed
    experiment_id = configure(args.mlflow_dir)
    print(f"MLflow UI on http://{args.host}:{args.port} for {folder} (Ctrl-C stops it)\n"
          f"  runs with their key metrics: {key_metrics_url(experiment_id, args.host, args.port)}", file=sys.stderr)
    return serve_ui(args.mlflow_dir, host=args.host, port=args.port, workers=args.workers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hcqr", description="Hypothesis-Conditioned Query Rewriting (HCQR) for retrieval-augmented MCQA.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_versions())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, formatter_class=HelpFormatter, **kwargs)

    p = command(
        "index", help="build a retrieval index over a corpus",
        description="Build a retrieval index over a corpus. The passages are stored in the index (an Arrow file,\n"
                    "memory-mapped when searched). Dense builds encode in chunks written to disk as they finish:\n"
                    "the same command resumes a killed build, and another index type over the same corpus and\n"
                    "passage encoder reuses the embeddings (see --embeddings).",
        epilog="encoder specs (--encoder):\n"
               "  (none) or default          all-MiniLM-L6-v2, packaged; one model for queries and passages, cosine\n"
               "  NAME_OR_PATH               any sentence-transformers model, used the same way\n"
               "  QUERY_MODEL,PASSAGE_MODEL  a pair: queries through the first, passages through the second (cosine)\n"
               "  medcpt                     the HCQR reference retriever: ncbi/MedCPT-Query-Encoder (queries, <= 64\n"
               "                             tokens) + ncbi/MedCPT-Article-Encoder ([title, content], <= 512 tokens),\n"
               "                             CLS pooling, raw inner product; weights from the Hugging Face hub cache\n"
               "  medcpt:QUERY_DIR,ARTICLE_DIR  the same, weights from two local folders\n"
               "faiss index types (--faiss, any faiss index_factory string, inner product):\n"
               "  Flat (exact, default), HNSW32 (graph; search with --ef-search), IVF1024,PQ32 or IVF4096,SQ8\n"
               "  (compressed inverted lists, trained on a seeded sample; search with --nprobe);\n"
               "  IVF1024,PQ96,RFlat (PQ codes in RAM, full vectors memory-mapped from disk and re-scored exactly;\n"
               "  search with --nprobe and --k-factor): a corpus whose vectors do not fit in RAM")
    p.add_argument("--corpus", required=True, help=".jsonl file, folder of .jsonl files, or hub dataset name")
    p.add_argument("--retriever", choices=RETRIEVER_KINDS, default="dense", help="retriever kind")
    p.add_argument("--encoder", default=None, help="encoder spec (see below; default: all-MiniLM-L6-v2)")
    p.add_argument("--faiss", default=None, metavar="FACTORY",
                   help="faiss index_factory string of the dense index: Flat (default), HNSW32, IVF1024,PQ32 ...")
    p.add_argument("--train-size", type=_positive_int, default=None,
                   help="vectors sampled (seed 0) to train faiss types that need it (default: 64 per IVF list, "
                        "16,384 to 500,000)")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="passages per encoder batch")
    p.add_argument("--chunk-size", type=_positive_int, default=4096,
                   help="passages per embedding chunk written to disk (what a killed build resumes from)")
    p.add_argument("--embeddings", default=None, metavar="DIR",
                   help="root folder of saved passage embeddings (default: $HCQR_EMBEDDINGS, else "
                        "$HCQR_CACHE/embeddings, else ~/.cache/hcqr-dspy/embeddings)")
    p.add_argument("--duplicate-ids", choices=["error", "rename"], default="error",
                   help="a repeated passage id: refuse (default) or keep the row as <id>#2, #3 ...")
    p.add_argument("--out", required=True, help="index folder to write")
    p.add_argument("--backend", choices=["faiss", "milvus"], default="faiss",
                   help="where vectors and BM25 live: faiss/bm25s files in the index folder (default) or a Milvus collection")
    p.add_argument("--milvus-uri", default=None,
                   help="Milvus Lite database (a path ending in .db, embedded) or a server, http://host:port")
    p.add_argument("--collection", default=None, help="Milvus collection name (letters, digits, _)")
    p.add_argument("--milvus-index", default=None, type=str.upper, choices=["FLAT", "IVF_FLAT", "HNSW", "DISKANN"],
                   help="Milvus vector index type (default FLAT, exact)")
    p.add_argument("--milvus-index-param", action="append", default=None, metavar="NAME=VALUE",
                   help="index build parameter, e.g. M=32, efConstruction=80, nlist=128 (repeatable)")
    p.add_argument("--milvus-search-param", action="append", default=None, metavar="NAME=VALUE",
                   help="search parameter, e.g. ef=64, nprobe=16, search_list=64 (repeatable)")
    p.add_argument("--milvus-token-env", default=None, metavar="VAR",
                   help="name of the environment variable holding the server token (never the token itself)")
    p.add_argument("--milvus-index-timeout", type=float, default=None,
                   help="seconds to wait for a server to build the index (default 3600)")
    p.set_defaults(func=cmd_index)

    p = command("search", help="search an index with one or more queries")
    p.add_argument("--index", required=True, help="index folder")
    p.add_argument("--k", type=_positive_int, default=5, help="passages per query")
    p.add_argument("--corpus", default=None, help="corpus to search (default: the one the index was built on)")
    p.add_argument("--encoder", default=None,
                   help="expected encoder spec; refused if the index used another (medcpt:QUERY_DIR,ARTICLE_DIR "
                        "reads the same MedCPT pair from other folders; default: the index's)")
    _add_search_option_args(p)
    p.add_argument("--width", type=_positive_int, default=160, help="characters of each passage to print")
    p.add_argument("queries", nargs="+", help="query strings")
    p.set_defaults(func=cmd_search)

    p = command("eval", help="evaluate a method on a benchmark (resumable, tracked in MLflow)")
    _add_program_args(p)
    p.add_argument("--dataset", required=True, help="MIRAGE-format .json file or hub dataset name")
    _add_run_args(p, "evaluate")
    p.set_defaults(func=cmd_eval)

    p = command("predict", help="answer a file of questions, with or without gold answers (resumable, tracked)",
                description="Answer every question of a file with a program (typically a compiled one: --program)\n"
                            "and write the answers, with their hypothesis, queries and passages, to --out. Questions\n"
                            "need no gold answer; a file that has them is scored too. The run folder records each\n"
                            "answer as it finishes: the same command resumes an interrupted run.")
    _add_program_args(p)
    p.add_argument("--input", required=True,
                   help="questions: a MIRAGE-format .json file ({qid: {question, options[, answer]}}) or a .jsonl file "
                        "(one {id, question, options[, answer]} per line)")
    p.add_argument("--out", required=True, help="answers file: .jsonl (one answer per line) or .json ({qid: answer})")
    _add_run_args(p, "answer")
    p.set_defaults(func=cmd_predict)

    p = command("ask", help="answer one question and show hypothesis, queries and passages")
    _add_program_args(p)
    p.add_argument("--question", default=None, help="question text (default: none; or give --json)")
    p.add_argument("--option", action="append", help="an option as LETTER=text, repeated (default: none)")
    p.add_argument("--json", default=None, help="a JSON file holding {question, options} (default: none)")
    p.add_argument("--width", type=_positive_int, default=100, help="characters of each passage to print")
    p.add_argument("--mlflow-dir", default=None,
                   help="MLflow store of --program runs:/ and models:/ URIs (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    _add_lm_args(p)
    p.set_defaults(func=cmd_ask)

    p = command("demo", help="run HCQR, CoT and Simple RAG on the embedded demo questions")
    p.add_argument("--index", default="indexes/demo", help="demo index folder (built if missing)")
    p.add_argument("--retriever", choices=RETRIEVER_KINDS, default="dense", help="retriever of a demo index built now")
    p.add_argument("--methods", default="hcqr,cot,simple_rag",
                   help="comma-separated methods, run in this order (the first HCQR answer is shown in full)")
    p.add_argument("--runs", default="runs/demo", help="folder of the demo's run folders (resumed if present)")
    p.add_argument("--limit", type=_positive_int, default=None, help="demo questions to run (default: all 20)")
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.add_argument("--lm", default="local", help="LM spec (see `hcqr eval --help`)")
    p.add_argument("--max-tokens", type=_positive_int, default=1024, help="output tokens per LM call")
    p.set_defaults(func=cmd_demo)

    p = command("judge", help="label each run question's retrieved context with the DUR judge")
    p.add_argument("runs", nargs="+", help="run folders (from `hcqr eval`)")
    p.add_argument("--judge-lm", default=None, help="LM spec of the judge (default: the run's LM)")
    p.add_argument("--mode", choices=["context", "passage"], default="context",
                   help="judge the shown context (default) or each shown passage")
    p.add_argument("--no-reasoning", action="store_true",
                   help="the judge gives its label alone (default: it reasons first, as dspy.ChainOfThought)")
    p.add_argument("--index", default=None, help="index folder (default: the run's)")
    p.add_argument("--threads", type=_positive_int, default=1, help="judgments in flight")
    sample = p.add_mutually_exclusive_group()
    sample.add_argument("--limit", type=_positive_int, default=None,
                        help="judge a seeded sample of N of the run's questions, drawn as `hcqr eval --limit` draws, so "
                             "runs over the same questions are judged on the same ones (default: all)")
    sample.add_argument("--ids", default=None, help="judge only these comma-separated question ids (default: all)")
    p.add_argument("--seed", type=int, default=None, help="seed of the --limit sample (default 0)")
    _add_mlflow_args(p)
    p.add_argument("--api-base", default=None, help="API base URL of a LiteLLM judge (default: the provider's)")
    p.add_argument("--api-key-env", default=None,
                   help="name of the environment variable holding the judge's API key (default: none)")
    p.add_argument("--max-tokens", type=_positive_int, default=512, help="output tokens per judge call (default 512)")
    p.add_argument("--n-ctx", type=_positive_int, default=8192, help="context window of a local judge (default 8192)")
    p.set_defaults(func=cmd_judge)

    p = command("compare", help="compare runs on the same questions: table, McNemar tests, plots")
    p.add_argument("runs", nargs="+", help="two or more run folders")
    p.add_argument("--reference", default=None, help="reference run (method label or folder; default: the first)")
    p.add_argument("--out", default="comparison", help="folder for comparison.md/json and PNG plots")
    p.add_argument("--qrels", default=None,
                   help="relevance judgments for recall@k / nDCG@10 (default: qrels.json beside the dataset, if any)")
    p.add_argument("--common", action="store_true",
                   help="runs still under way over the same question set: compare them on the questions every run "
                        "has answered, saying how many (default: off, the runs must hold the same questions)")
    _add_mlflow_args(p)
    p.set_defaults(func=cmd_compare)

    p = command("experiment", help="run an experiment grid (methods x datasets) from a YAML file")
    p.add_argument("file", help="experiment YAML file, or the name of one in ./experiments/ or shipped (paper_main, ablations)")
    p.add_argument("--limit", type=_positive_int, default=None, help="override the question sample size (default: the file's)")
    p.add_argument("--lm", default=None, help="override the experiment's LM spec (default: the file's)")
    p.add_argument("--datasets", default=None, help="comma-separated subset of the file's datasets (default: all)")
    p.add_argument("--runs", default="runs/experiments", help="root of the experiment's run folders")
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.add_argument("--check", action="store_true",
                   help="validate the file and stop (no LM call); every problem is printed, one line each")
    _add_encoder_backend_arg(p)
    p.set_defaults(func=cmd_experiment)

    p = command("compile", help="optimize a program's prompts with a DSPy optimizer recipe and save it")
    p.add_argument("--recipe", required=True,
                   help="recipe file, or the name of one in ./optimizers/ or shipped (bootstrap_fewshot, mipro_light ...)")
    p.add_argument("--program", default="hcqr", metavar="METHOD",
                   help=f"method to compile, one of: {', '.join(METHODS)} (default: hcqr)")
    p.add_argument("--train", required=True, help="MIRAGE-format file of training questions (e.g. medmcqa.json)")
    p.add_argument("--train-size", type=_positive_int, default=None, help="training questions (default: the recipe's)")
    p.add_argument("--val-size", type=_non_negative_int, default=None, help="validation questions (default: the recipe's)")
    p.add_argument("--holdout", action="append", default=None,
                   help="an evaluation file that must not share questions with the training set, repeated (default: none)")
    p.add_argument("--index", default=None, help="index folder (default: none, needed by retrieval methods)")
    p.add_argument("--budget", type=_positive_int, default=None, help="passages shown (default: the method's, 15)")
    p.add_argument("--k-per-query", type=_positive_int, default=None,
                   help="passages per query, HCQR and its ablations (default: ceil(budget / queries))")
    p.add_argument("--fusion", choices=FUSION_STRATEGIES, default=None, help="multi-query fusion (default: score_sum)")
    p.add_argument("--out", required=True, help="folder of the saved program (e.g. programs/hcqr-bfs)")
    p.add_argument("--register", default=None, metavar="NAME",
                   help="register the compiled program in the MLflow Model Registry as NAME (a new version; "
                        "then --program models:/NAME/VERSION; default: not registered)")
    p.add_argument("--alias", default=None, help="alias of the registered version, e.g. champion "
                                                 "(--program models:/NAME@ALIAS; default: none)")
    p.add_argument("--reflection-lm", default=None, help="GEPA's reflection LM spec (default: the recipe's)")
    p.add_argument("--reflection-api-base", default=None, help="API base of the reflection LM (default: none)")
    p.add_argument("--reflection-api-key-env", default=None,
                   help="name of the environment variable holding the reflection LM's API key (default: none)")
    _add_mlflow_args(p)
    _add_lm_args(p)
    p.set_defaults(func=cmd_compile)

    p = command("ui", help="start the MLflow UI for the tracking store (127.0.0.1 by default)")
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_positive_int, default=5000, help="port to serve on")
    p.add_argument("--workers", type=_positive_int, default=1, help="MLflow server worker processes")
    p.set_defaults(func=cmd_ui)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except HCQRError as exc:
        print(f"hcqr: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hcqr: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
