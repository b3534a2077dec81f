"""Memory and MLflow store growth of ``hcqr eval`` over many questions, against the tests' stub LM.

Usage:
    python bench/eval_memory.py [--questions 20000] [--method cot] [--traces full|light|off] [--every 500]
                                [--label NAME] [--keep DIR] [--out bench/results.json]

The real command (``python -m hcqr_dspy.cli eval``, MLflow tracking on as by default) runs in a child process over
``--questions`` labelled questions "Question number N? <a clinical sentence>", answered by the stub
OpenAI-compatible server of the tests (``tests/stub_server.py``, a thread of this process bound to 127.0.0.1, no
delay), so the figures measure hcqr, DSPy and MLflow, not an LM. Every question is new (a fresh DSPy cache folder).
A retrieving method (``--method simple_rag``, ``hcqr`` ...) searches a BM25 index of the demo corpus built first; the
clinical sentence gives BM25 passages to find, as a real question would.

Measured: the child's resident memory (``VmRSS`` of ``/proc/<pid>/status``, polled every 0.2 s) at its first row
and each time ``predictions.jsonl`` passes a multiple of ``--every`` rows; its peak (``VmHWM``) during the loop and
after the last row (metrics, trace checks, scoring); the slope of RSS over questions (least squares over the
samples from 1,000 questions on, or from a fifth of a shorter run; KB per question); the MLflow store's bytes when
the command has exited (``mlflow.db`` with its journal files, plus ``artifacts/``) per question, and the stored
span text per question by span name (``spans.content`` of the SQLite store), and the traces MLflow dropped or hcqr
rebuilt (:func:`trace_losses`). Results are merged into ``--out``
under ``eval_memory/<method>/<traces>`` (``/<label>`` added with ``--label``) and rendered into ``RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.append(str(REPO / "tests"))  # the stub LM server is test support
from report import checked_out, write_results  # noqa: E402
from stub_server import OPTIONS, SECRET, Stub  # noqa: E402

CLINICAL = "A 78-year-old patient taking digoxin has nausea and yellow vision; which finding explains it best?"
SLOPE_FROM = 1000  # questions: the RSS slope is fitted over the samples from here on (a fifth of a shorter run)


def write_questions(path: Path, n: int) -> None:
    """``n`` labelled questions the stub answers right (its letter for question i is "ABC"[2i mod 3])."""
    qs = {
        f"q{i:06d}": {"question": f"Question number {i}? {CLINICAL}", "options": OPTIONS, "answer": "ABC"[i * 2 % 3]}
        for i in range(n)
    }
    path.write_text(json.dumps(qs))


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a live process, in KB (``{}`` once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def store_bytes(store: Path) -> dict[str, int]:
    """The SQLite database (with its ``-wal``/``-journal`` files) and the artifacts folder, in bytes."""
    db = sum(tree_bytes(store / f"mlflow.db{suffix}") for suffix in ("", "-wal", "-journal", "-shm"))
    return {"db": db, "artifacts": tree_bytes(store / "artifacts")}


def span_text(db: Path, n: int) -> dict:
    """Stored span text per question by span name (bytes of ``spans.content``), the traces and their spans."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        traces = con.execute("SELECT count(*) FROM trace_info").fetchone()[0]
        rows = con.execute("SELECT name, count(*), sum(length(content)) FROM spans GROUP BY name").fetchall()
    finally:
        con.close()
    by_name = {name: {"spans_per_question": round(c / n, 2), "bytes_per_question": round(b / n)} for name, c, b in rows}
    top = dict(sorted(by_name.items(), key=lambda kv: -kv[1]["bytes_per_question"])[:8])
    return {
        "traces": traces,
        "spans_per_question": round(sum(c for _, c, _ in rows) / n, 2),
        "span_bytes_per_question": round(sum(b for _, _, b in rows) / n),
        "top_spans": top,
    }


def trace_losses(log: str) -> dict:
    """What the command's output says of lost traces: MLflow's "Trace export queue is full" warnings (it drops a
    trace after each) and the traces hcqr rebuilt from the rows at the end (``hcqr: note: N of M question traces
    were missing``)."""
    rebuilt = re.search(r"(\d+) of \d+ question traces were missing", log)
    return {
        "queue_full_warnings": log.count("Trace export queue is full"),
        "rebuilt": int(rebuilt[1]) if rebuilt else 0,
    }


def slope_kb_per_question(samples: list[dict], questions: int) -> float | None:
    """Least-squares slope of RSS (KB) over questions, from :data:`SLOPE_FROM` questions on (from a fifth of
    ``questions`` when that is fewer)."""
    start = min(SLOPE_FROM, questions // 5)
    pts = [(s["questions"], s["rss_kb"]) for s in samples if s["questions"] >= start]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return round(sum((x - mx) * (y - my) for x, y in pts) / den, 2) if den else None


def build_index(tmp: Path) -> Path:
    out = tmp / "index"
    corpus = REPO / "data" / "demo" / "corpus.jsonl"
    cmd = [sys.executable, "-m", "hcqr_dspy.cli", "index", "--corpus", str(corpus), "--retriever", "bm25"]
    subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True)
    return out


def machine() -> dict:
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln),
        platform.processor(),
    )
    return {"nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version()}


def run(args, tmp: Path, stub: Stub) -> dict:
    """Run the command, sampling its memory as rows come; return the section."""
    qs, run_dir, store = tmp / "qs.json", tmp / "run", tmp / "mlruns"
    write_questions(qs, args.questions)
    argv = [sys.executable, "-m", "hcqr_dspy.cli", "eval", "--method", args.method, "--dataset", str(qs)]
    argv += ["--run-dir", str(run_dir), "--mlflow-dir", str(store), "--lm", "openai/stub-model"]
    argv += ["--api-base", stub.base, "--api-key-env", "STUB_KEY"]
    if args.method not in ("cot", "no_context"):
        argv += ["--index", str(build_index(tmp))]
    if args.traces:
        argv += ["--traces", args.traces]
    env = {**os.environ, "STUB_KEY": SECRET, "DSPY_CACHEDIR": str(tmp / "dspy-cache"), "HCQR_MLFLOW_DIR": str(store)}
    log = open(tmp / "eval.log", "w")
    load_start = os.getloadavg()
    t0 = time.monotonic()
    child = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    predictions = run_dir / "predictions.jsonl"
    rows, offset, samples, hwm_loop, next_mark = 0, 0, [], 0, 1
    status: dict[str, int] = {}
    last_row_at = None
    while child.poll() is None:
        time.sleep(0.2)
        stub.seen.clear()  # the stub keeps every request it answered; this process is not the one measured
        status = proc_status(child.pid) or status
        if predictions.exists():
            with open(predictions, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            offset += len(chunk)
            rows += chunk.count(b"\n")
        if rows >= next_mark and status:
            samples.append(
                {
                    "questions": rows,
                    "seconds": round(time.monotonic() - t0, 1),
                    "rss_kb": status["VmRSS"],
                    "store_bytes": sum(store_bytes(store).values()),
                }
            )
            print(json.dumps(samples[-1]), flush=True)
            next_mark = (rows // args.every + 1) * args.every
        if status and last_row_at is None:  # the peak up to the poll that saw the last row
            hwm_loop = status.get("VmHWM", hwm_loop)
        if last_row_at is None and rows >= args.questions:
            last_row_at = time.monotonic() - t0
    log.close()
    seconds = time.monotonic() - t0
    if child.returncode != 0:
        tail = (tmp / "eval.log").read_text()[-3000:]
        raise SystemExit(f"bench: hcqr eval exited with {child.returncode}:\n{tail}")
    sizes = store_bytes(store)
    n = args.questions
    at = {str(k): next((s["rss_kb"] for s in samples if s["questions"] >= k), None) for k in (1, 1000, 5000, 20000)}
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "method": args.method,
        "traces": args.traces or "full",
        "label": args.label,
        "questions": n,
        "seconds": round(seconds, 1),
        "seconds_to_first_row": samples[0]["seconds"] if samples else None,
        "seconds_to_last_row": round(last_row_at, 1) if last_row_at else None,
        "rss_kb_at": at,
        "rss_kb_last_sample": samples[-1]["rss_kb"] if samples else None,
        "peak_rss_kb_loop": hwm_loop,
        "peak_rss_kb": status.get("VmHWM"),
        "slope_kb_per_question": slope_kb_per_question(samples, n),
        "slope_from": min(SLOPE_FROM, n // 5),
        "store_bytes": sizes,
        "store_bytes_per_question": round(sum(sizes.values()) / n),
        "run_folder_bytes": tree_bytes(run_dir),
        "spans": span_text(store / "mlflow.db", n),
        "trace_losses": trace_losses((tmp / "eval.log").read_text(errors="replace")),
        "samples": samples,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=20000, help="questions to run")
    ap.add_argument("--method", default="cot", help="the method to evaluate")
    ap.add_argument("--traces", choices=("full", "light", "off"), default=None, help="hcqr eval's --traces")
    ap.add_argument("--every", type=int, default=500, help="sample RSS every this many questions")
    ap.add_argument("--label", default=None, help="a suffix of the results key (another build of the code ...)")
    ap.add_argument("--keep", default=None, help="run in this folder and keep it (default: a temporary one)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    args = ap.parse_args(argv)
    if args.questions < 1 or args.every < 1:
        ap.error("--questions and --every must be positive")
    out = checked_out(ap, args.out)
    if args.keep and Path(args.keep).exists():
        ap.error(f"--keep {args.keep} exists; name a new folder (a run is never written over another's records)")
    stub = Stub()
    try:
        if args.keep:
            tmp = Path(args.keep)
            tmp.mkdir(parents=True, exist_ok=False)
            section = run(args, tmp, stub)
        else:
            with tempfile.TemporaryDirectory(prefix="hcqr-bench-memory-") as t:
                section = run(args, Path(t), stub)
    finally:
        stub.stop()
    key = f"eval_memory/{args.method}/{section['traces']}" + (f"/{args.label}" if args.label else "")
    write_results(out, section, key=key)
    print(f"bench: wrote {key} into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
