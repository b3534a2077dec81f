"""Serving benchmark: requests per minute of a registered HCQR program on MLflow's real scoring server.

Usage:
    python bench/serving.py [--delay 0.2] [--requests 3] [--out bench/results.json]

A zero-shot HCQR program over a BM25 index of the demo corpus is logged and registered in a temporary MLflow store
and served by ``mlflow models serve --env-manager local`` on 127.0.0.1, its LM the stub OpenAI-compatible server
of the tests (``tests/stub_server.py``), which waits ``--delay`` seconds before each reply: a stand-in for a remote
LM's latency, so the numbers measure the serving path (request parsing, schema enforcement, retrieval, DSPy,
tracing into the store), not an LM. For 1, 8 and 32 questions per request, ``--requests`` requests are sent one
after another, every question text new (nothing comes from DSPy's cache), once with the questions of a request run
in parallel (``HCQR_SERVE_THREADS=8``, the default) and once one after another (``HCQR_SERVE_THREADS=1``).
Results are merged into ``--out`` under ``serving``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.append(str(REPO / "tests"))  # the stub LM server and process helpers are test support
from helpers import free_port, start_scoring_server, stop_process_group  # noqa: E402
from report import read_results, write_results  # noqa: E402
from stub_server import OPTIONS, SECRET, Stub  # noqa: E402

BATCHES = (1, 8, 32)
THREADS = (8, 1)


def register_program(tmp: Path, stub: Stub) -> str:
    """A zero-shot HCQR program over a BM25 index of the demo corpus, registered as ``bench-hcqr``; its store URI."""
    import mlflow

    from hcqr_dspy.optimize.saved import save_program
    from hcqr_dspy.programs import make_program
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus
    from hcqr_dspy.tracking import store
    from hcqr_dspy.tracking.serving import log_program_model

    retriever = BM25Retriever(load_corpus(REPO / "data" / "demo" / "corpus.jsonl"), show_progress=False)
    retriever.save(tmp / "idx")
    save_program(make_program("hcqr", retriever), tmp / "prog")
    store.configure(tmp / "mlruns")
    with mlflow.start_run(run_name="bench serving"):
        log_program_model(
            tmp / "prog",
            lm="openai/stub-model",
            index=str(tmp / "idx"),
            register="bench-hcqr",
            api_base=stub.base,
            api_key_env="STUB_KEY",
            name="hcqr",
        )
    return store.tracking_uri(tmp / "mlruns")


def serve(tracking_uri: str, threads: int, tmp: Path) -> tuple[subprocess.Popen, str]:
    args = ["models", "serve", "-m", "models:/bench-hcqr/1", "--env-manager", "local", "-h", "127.0.0.1"]
    extra = {
        "STUB_KEY": SECRET,
        "HCQR_SERVE_THREADS": str(threads),
        "DSPY_CACHEDIR": str(tmp / f"dspy-cache-{threads}"),
    }
    return start_scoring_server([*args, "-p", str(free_port()), "-t", "1800"], tracking_uri, extra)


def post(url: str, records: list[dict]) -> float:
    """Seconds one request took (raises on anything but HTTP 200 with every question answered)."""
    body = json.dumps({"dataframe_records": records}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    start = time.monotonic()
    with urllib.request.urlopen(request, timeout=1800) as reply:
        answers = json.loads(reply.read())["predictions"]
    seconds = time.monotonic() - start
    if not all(a["valid"] for a in answers) or len(answers) != len(records):
        raise RuntimeError(f"a request was not fully answered: {answers[:2]}")
    return seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", type=float, default=0.2, help="the stub LM's seconds per reply")
    ap.add_argument("--requests", type=int, default=3, help="requests per batch size and thread setting")
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        read_results(out)
    except ValueError as exc:
        ap.error(str(exc))
    stub = Stub(delay=args.delay)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="hcqr-bench-serving-") as tmp:
            tracking_uri = register_program(Path(tmp), stub)
            for threads in THREADS:
                server, url = serve(tracking_uri, threads, Path(tmp))
                try:
                    for batch in BATCHES:
                        seconds = []
                        for _ in range(args.requests):
                            tag = uuid.uuid4().hex[:8]
                            records = [
                                {
                                    "qid": f"{tag}-{i}",
                                    "question": f"Question number {i}? Bench {tag}.",
                                    "options": OPTIONS,
                                }
                                for i in range(batch)
                            ]
                            seconds.append(post(url, records))
                        mean = sum(seconds) / len(seconds)
                        rows.append(
                            {
                                "threads": threads,
                                "questions_per_request": batch,
                                "requests": len(seconds),
                                "mean_request_seconds": round(mean, 3),
                                "requests_per_minute": round(60 / mean, 2),
                                "questions_per_minute": round(60 * batch / mean, 1),
                            }
                        )
                        print(json.dumps(rows[-1]), flush=True)
                finally:
                    stop_process_group(server)
    finally:
        stub.stop()
    section = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "lm_delay_seconds": args.delay,
        "lm_calls_per_question": 3,
        "rows": rows,
    }
    write_results(out, section, key="serving")
    print(f"bench: wrote the serving section of {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
