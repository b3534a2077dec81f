"""Retrieval at scale: faiss index types at the real ~41k and a synthetic 1M corpus, \
query runtimes, MedCorp extrapolation.

Usage:
    python bench/scale.py [--datasets real,1000000] [--types Flat,HNSW,IVF-PQ,IVF-SQ8,IVF-PQ+refine,BM25] [--repeats 50]
                          [--runtimes torch,onnx,onnx-int8,openvino,openvino-bf16] [--quick] [--out bench/results.json]

Datasets (``bench/scale_data.py``): ``real`` is the shared corpus, embedded
once into the embedding store; ``N`` is N synthetic passages made from the
real passages and their real embeddings (new ids, recombined texts, mixed
and noised vectors; no encoder runs). Both are searched with the same real
queries: the retrieval bench's 8 HCQR-shaped triples (latency) and those 24
queries plus 100 MedQA-US questions (recall).

For each dataset and index type (``TYPES``: faiss ``index_factory`` strings
and their search options):

* build, in its own process, from the finished embeddings (nothing is
  encoded): seconds, passages/s, peak RSS of the build;
* bytes per passage of the index structure on disk (the faiss file) and in
  RAM (resident memory the index adds in a fresh process, read by the
  product's reader and searched once with every recall query: for the
  memory-mapped ``IVF-PQ+refine``, only the pages those searches touched);
* peak RSS of ``load_index`` plus one 3-query search in a fresh process
  (corpus included: the passage store is memory-mapped), against the target:
  at most 300 MB beyond the encoder's own footprint and the index structure's
  own bytes; the same for a BM25 index;
* p50 / p95 of HCQR's retrieval step (``search`` of 3 queries, k=5 each,
  fused to 15, query encoding included, PyTorch runtime);
* recall@15 against ``Flat`` on the real queries, and (untimed) by
  ``nprobe`` for IVF types and by ``efSearch`` for HNSW;
* memory-mapped types only (``IVF-PQ+refine``): every recall query searched
  again with the process's memory capped at 1/8 of Flat's index bytes (a
  cgroup v1 memory limit, the index file first evicted from the page cache,
  so every page the search needs is read and charged under the cap): recall,
  latency, peak charged memory and major page faults under the cap.

Query runtimes, side by side on the real corpus (``Flat`` and ``HNSW``):
p50 / p95 of the same step and of the query encoding alone, and the top-15
agreement of each runtime's hits with PyTorch's (mean share of common ids
over the recall queries); a runtime is kept only at 0.99 or more.

MedCorp extrapolation: RAM and disk for 54M passages per index type from
the measured bytes per passage (384-d all-MiniLM-L6-v2 vectors; MedCPT's
768-d would double Flat, HNSW and SQ8, not PQ's fixed code size).

Timed phases (builds, latencies) should run on an idle machine. Results are
merged into ``--out`` under ``scale`` after each dataset and rendered into
RESULTS.md; for each timed phase the load average at its start and the CPU
time other processes used during it are recorded. ``--types`` re-measures
some types of a dataset (``Flat``, the recall reference, always): the other
types keep their earlier figures, each dated.
``--quick``: a 5,000-passage real slice and 50,000 synthetic passages, 10
repeats.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from report import RECALL_K, read_results, write_results  # noqa: E402
from scale_children import memory_cgroup  # noqa: E402, F401  (tests/test_bench_scale.py reads it from here)
from scale_data import DEFAULT_CORPUS, DEFAULT_WORK, load_real, real_queries, synthesize  # noqa: E402
from scale_measure import add_sweeps, measure_dataset, types_for  # noqa: E402
from scale_targets import medcorp, targets  # noqa: E402


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``: every state but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (``os.times``)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Pauser:
    """Record each timed phase's load average at its start, its length and the CPU seconds other processes used
    during it (the machine's busy time less this process tree's); with ``--pause-study``, stop the lead's background
    study for the phase (``/work/logs/study-pause.sh stop``) and always resume it after."""

    def __init__(self, command: str | None):
        self.command = command
        self.paused_seconds = 0.0

    def __call__(self, out: dict, phase: str):
        pauser = self

        class Phase:
            def __enter__(self):
                if pauser.command:
                    subprocess.run([pauser.command, "stop"], check=False)
                    time.sleep(1)
                self.t0, self.busy, self.own = time.perf_counter(), busy_cpu_seconds(), own_cpu_seconds()
                from hcqr_dspy.evaluation.cpu_pressure import PressureWindow

                self.pressure = PressureWindow()
                out["timed_phases"].append(
                    {
                        "phase": phase,
                        "date": datetime.now(UTC).isoformat(timespec="seconds"),
                        "load_average_at_start": load_average(),
                        "study_paused": bool(pauser.command),
                    }
                )
                return self

            def __exit__(self, *exc):
                seconds = time.perf_counter() - self.t0
                other = (busy_cpu_seconds() - self.busy) - (own_cpu_seconds() - self.own)
                out["timed_phases"][-1].update(
                    seconds=round(seconds, 1),
                    other_cpu_seconds=round(max(other, 0.0), 1),
                    cpu_pressure=self.pressure.share(),  # the share of the phase some task waited for a CPU (PSI)
                )
                if pauser.command:
                    subprocess.run([pauser.command, "cont"], check=False)
                    pauser.paused_seconds += seconds
                return False

        return Phase()


def sweep_only(out: Path, work: Path, datasets: list[str]) -> int:
    """Add ``recall_by_nprobe`` / ``recall_by_efSearch`` to measured datasets from their saved indexes (untimed;
    nothing is rebuilt)."""
    from hcqr_dspy.retrieval import load_encoder, load_index

    section = read_results(out).get("scale") or {}
    _, recall_queries = real_queries()
    q_vectors = load_encoder(None).encode_queries(recall_queries)
    for d in datasets:
        measured = section.get("datasets", {}).get(d)
        folder = work / f"indexes-{d.replace(':', '-')}"
        if measured is None or not (folder / "Flat").is_dir():
            print(f"bench: {d} has no measurement in {out} or no indexes in {folder}", file=sys.stderr)
            return 2
        _, truth = load_index(folder / "Flat").index.search(q_vectors, RECALL_K)
        for name, m in measured["types"].items():
            add_sweeps(d, folder / name, m, q_vectors, truth)
    section["targets"] = targets(section)
    write_results(out, section, key="scale")
    return 0


def rederive(out: Path) -> int:
    """Recompute what is derived from the measured figures (MedCorp extrapolation, targets) and re-render."""
    section = read_results(out).get("scale")
    if not section:
        print(f"bench: {out} has no scale section", file=sys.stderr)
        return 2
    section["medcorp"] = medcorp(section["datasets"])
    section["targets"] = targets(section)
    write_results(out, section, key="scale")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument(
        "--datasets", default="real,1000000", help="comma-separated: 'real', 'real:N' (seeded slice) or N synthetic"
    )
    ap.add_argument(
        "--types",
        default="Flat,HNSW,IVF-PQ,IVF-SQ8,IVF-PQ+refine,BM25",
        help="types to (re-)measure; a dataset measured before keeps its other types' figures",
    )
    ap.add_argument(
        "--runtimes",
        default="torch,onnx,onnx-int8,openvino,openvino-bf16",
        help="query runtimes compared on the real corpus",
    )
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="real:5000 and 50000 synthetic, 10 repeats")
    ap.add_argument("--work", default=str(DEFAULT_WORK), help="folder of the prepared datasets and indexes (reused)")
    ap.add_argument(
        "--pause-study",
        default=None,
        metavar="SCRIPT",
        help="a script taking stop|cont, run around every timed phase (e.g. /work/logs/study-pause.sh)",
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    ap.add_argument(
        "--sweep-only",
        action="store_true",
        help="only add recall@15 by nprobe to datasets already in --out, from their indexes kept in --work",
    )
    ap.add_argument(
        "--rederive",
        action="store_true",
        help="only recompute the MedCorp extrapolation and the targets from the figures in --out (nothing measured)",
    )
    args = ap.parse_args(argv)
    from hcqr_dspy.retrieval.retriever_base import library_versions

    types = [t.strip() for t in args.types.split(",") if t.strip()]
    if not types or set(types) - {*types_for(1), "BM25"} or "Flat" not in types:
        ap.error(f"--types takes Flat (the reference) and some of {', '.join([*types_for(1), 'BM25'])}")
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    datasets = ["real:5000", "50000"] if args.quick else [d.strip() for d in args.datasets.split(",") if d.strip()]
    for d in datasets:
        if not (d == "real" or (d.startswith("real:") and d[5:].isdigit()) or d.isdigit()):
            ap.error(f"--datasets: {d!r} is not 'real', 'real:N' or N")
    if not Path(args.corpus).exists():
        print(f"bench: corpus {args.corpus} is absent: set HCQR_SHARED_DATA or pass --corpus", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        read_results(out)
    except ValueError as exc:
        ap.error(str(exc))
    repeats = 10 if args.quick else args.repeats
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    pause = Pauser(args.pause_study)
    section = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "quick": args.quick,
        "planned": datasets,
        "datasets": {},
        "versions": library_versions(
            "hcqr-dspy", "faiss-cpu", "bm25s", "sentence-transformers", "torch", "onnxruntime", "openvino", "numpy"
        ),
    }
    previous = read_results(out).get("scale") or {}
    earlier = previous.get("datasets", {}) if previous.get("quick") == args.quick else {}
    if previous.get("quick") == args.quick:  # a run of other datasets keeps the ones measured before (each dated)
        kept = {k: v for k, v in previous.get("datasets", {}).items() if k not in datasets}
        section["datasets"].update(kept)
        section["planned"] = [*kept, *datasets]
        section["study_paused_seconds"] = previous.get("study_paused_seconds", 0)
    if args.sweep_only:
        return sweep_only(out, work, datasets)
    if args.rederive:
        return rederive(out)
    real = None
    for d in datasets:
        if d.startswith("real"):
            real = load_real(args.corpus, work, int(d[5:]) if ":" in d else None)
            corpus, store, info = real
        else:
            if real is None or real[0].folder is None or len(real[0]) < 1000:
                real = load_real(args.corpus, work)
            corpus, store, info = synthesize(int(d), real[0], real[1], work)
        section["datasets"][d] = {
            **measure_dataset(
                d.replace(":", "-"),
                corpus,
                store,
                info,
                work,
                repeats,
                types,
                runtimes if d.startswith("real") else [],
                pause,
                earlier.get(d),
            )
        }
        before = list(previous.get("datasets", {}))  # a re-measured dataset keeps its place in the report
        place = lambda label, before=before: before.index(label) if label in before else len(before)  # noqa: E731
        section["datasets"] = dict(sorted(section["datasets"].items(), key=lambda kv: place(kv[0])))
        section["planned"] = sorted(section["planned"], key=place)
        section["medcorp"] = medcorp(section["datasets"])
        section["targets"] = targets(section)
        section["study_paused_seconds"] = round(section.get("study_paused_seconds", 0) + pause.paused_seconds, 1)
        pause.paused_seconds = 0.0
        write_results(out, section, key="scale")  # after each dataset: an interrupted run keeps what it measured
    print(f"bench: wrote {out} and {out.with_name('RESULTS.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
