"""The benchmark's results file and report: one reader/writer of ``results.json`` and ``RESULTS.md``.

``bench/retrieval.py``, ``bench/scale.py``, ``bench/milvus.py``, ``bench/pipeline.py``, ``bench/lm.py``,
``bench/lm_pipeline.py``, ``bench/lm_overhead.py``, ``bench/lm_ratio.py``, ``bench/serving.py`` and
``bench/eval_memory.py`` each measure one section (``retrieval``, ``scale``, ``milvus``, ``pipeline``, ``lm``,
``lm_pipeline/<model>/<build>``, ``lm_overhead/<model>/<build>``, ``lm_ratio/<model>/<build>``, ``serving`` and
``eval_memory/<method>/<traces>``) and merge it here with
:func:`write_results`, which re-renders ``RESULTS.md`` from the whole file (the LM sections with
``bench/report_lm.py``). None imports another, except what the LM scripts on the demo share
(``bench/demo_setup.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from report_lm import render_lm, render_lm_overhead, render_lm_pipeline, render_lm_ratio
from report_memory import render_eval_memory
from report_serving import render_serving

REPO = Path(__file__).resolve().parents[1]
# The retrieval bench's approximate-search settings and recall depth (rendered in the report's headings).
HNSW = {"M": 32, "efConstruction": 80, "efSearch": 64}
RECALL_K = 15


def beyond_structure_mb(m: dict) -> float:
    """What ``load_index`` + one 3-query search added (peak RSS, MB) beyond the index structure's own bytes: the
    faiss file's size for a type read into the heap; for a memory-mapped type only its heap part, so every mapped
    page the load and the search touched counts against it; for BM25 (memory-mapped), nothing is subtracted."""
    if "index_file_bytes" not in m:  # BM25
        return m["load_search_added_mb"]
    structure = m["structure_anon_mb"] if m.get("memory_mapped") else m["index_file_bytes"] / 2**20
    return round(m["load_search_added_mb"] - structure, 1)


def render(results: dict) -> str:
    lines = ["# hcqr-dspy benchmark results", ""]
    r = results.get("retrieval")
    if r and "sizes" in r:  # (a results file from before the size sweep is rewritten by the next full run)
        lines += [
            f"Retrieval measured {r['date']} on {r['machine']} by `bench/retrieval.py` over `{r['corpus']}`"
            f" ({r['corpus_passages']} passages; slices are seeded random samples)."
            + (" **Quick run (`--quick`): the 1k slice only, 20 repeats.**" if r.get("quick") else "")
            + (
                f" **Partial run: only {', '.join(r['sizes'])} measured of {', '.join(r['planned_sizes'])}.**"
                if len(r["sizes"]) < len(r.get("planned_sizes", r["sizes"]))
                else ""
            ),
            "",
            "## Index build (each in its own process)",
            "",
            "Dense build seconds run from `build_retriever` to a finished faiss index, so they include loading the"
            " encoder; the raw encode column times `SentenceTransformer.encode` alone on the same passages (encoder"
            " already loaded, same batch size). Build / raw is the ratio of their passages/s (1.0 = the index adds"
            " nothing over encoding).",
            "",
            "| passages | retriever | build s | passages/s | raw encode passages/s | build / raw | peak RSS MB "
            "| index size |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for _label, s in r["sizes"].items():
            for kind in ("bm25", "dense"):
                m = s["retrievers"][kind]
                raw = f"{m['raw_passages_per_second']}" if "raw_passages_per_second" in m else "–"
                ratio = f"{m['build_over_raw']}" if "build_over_raw" in m else "–"
                lines.append(
                    f"| {s['passages']} | {kind} | {m['build_seconds']} | {m['passages_per_second']} | {raw} | "
                    f"{ratio} | {m['peak_rss_mb']} | {m['index_bytes'] / 1e6:.1f} MB |"
                )
        lines += [
            "",
            "## HCQR retrieval step: 3 queries, k=5 each, fused to 15 (encoder loaded)",
            "",
            "| passages | retriever | p50 ms | p95 ms |",
            "|---:|---|---:|---:|",
        ]
        for _label, s in r["sizes"].items():
            for kind in ("bm25", "dense", "hybrid"):
                m = s["retrievers"][kind]
                lines.append(f"| {s['passages']} | {kind} | {m['search3_fuse_ms_p50']} | {m['search3_fuse_ms_p95']} |")
        lines += [
            "",
            f"## faiss exact (IndexFlatIP) vs HNSW (M={HNSW['M']}, efConstruction={HNSW['efConstruction']}, "
            f"efSearch={HNSW['efSearch']})",
            "",
            f"| passages | queries | recall@{RECALL_K} of HNSW | HNSW build s | exact 3-query search ms "
            "| HNSW 3-query search ms |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for _label, s in r["sizes"].items():
            a = s["ann"]
            lines.append(
                f"| {s['passages']} | {a['queries']} | {a[f'recall_at_{RECALL_K}']} | {a['hnsw_build_seconds']} | "
                f"{a['exact_search3_ms_p50']} | {a['hnsw_search3_ms_p50']} |"
            )
        lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()), ""]
    sc = results.get("scale")
    if sc and sc.get("datasets"):
        lines += render_scale(sc)
    m = results.get("milvus")
    if m and m.get("datasets"):
        lines += render_milvus(m)
    p = results.get("pipeline")
    if p:
        lines += render_pipeline(p)
    if results.get("lm"):
        lines += render_lm(results["lm"])
    for key in sorted(k for k in results if k.startswith("lm_pipeline/")):
        lines += render_lm_pipeline(results[key])  # one per model and llama.cpp build
    for key in sorted(k for k in results if k.startswith("lm_overhead/")):
        lines += render_lm_overhead(results[key])
    for key in sorted(k for k in results if k.startswith("lm_ratio/")):
        lines += render_lm_ratio(results[key])
    if results.get("serving"):
        lines += render_serving(results["serving"])
    lines += render_eval_memory(results)
    return "\n".join(lines)


def shown_path(path: str) -> str:
    """Relative to the repository when inside it or its parent (``../shared/data/...``), else absolute."""
    full = Path(path).resolve()
    return os.path.relpath(full, REPO) if full.is_relative_to(REPO.parent) and REPO.parent != Path("/") else str(full)


def write_results(out: Path, section: dict, key: str = "retrieval") -> None:
    """Merge ``section`` into the results file under ``key`` (``retrieval`` or ``pipeline``) and re-render
    RESULTS.md beside it.

    Raises:
        ValueError: the existing results file is unreadable (see :func:`read_results`).
    """
    results = read_results(out)
    results[key] = section
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    out.with_name("RESULTS.md").write_text(render(results))


def checked_out(ap, out: str | Path) -> Path:
    """A script's ``--out`` as a path, refused with argparse's one-line error (exit 2) when it is not a readable
    results file, or it or the RESULTS.md beside it cannot be written (its folder is made here), before anything
    is measured (the measurements would be lost at the end)."""
    out = Path(out)
    try:
        read_results(out)
    except ValueError as exc:
        ap.error(str(exc))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = "a file is in its way" if isinstance(exc, FileExistsError | NotADirectoryError) else exc.strerror
        ap.error(f"--out {out}: its folder cannot be made ({why})")
    unwritable = [p for p in (out, out.with_name("RESULTS.md")) if p.exists() and not os.access(p, os.W_OK)]
    if not os.access(out.parent, os.W_OK) or unwritable:
        ap.error(f"--out {out}: {unwritable[0] if unwritable else out.parent} cannot be written")
    return out


def read_results(out: Path) -> dict:
    """The results file as a JSON object ({} when absent).

    Raises:
        ValueError: the file is unreadable, not JSON, or not a JSON object.
    """
    if not out.exists():
        return {}
    try:
        results = json.loads(out.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{out} is not a readable results file ({exc}); move it away or pass another --out") from None
    if not isinstance(results, dict):
        raise ValueError(f"{out} is not a results file (a JSON object); move it away or pass another --out")
    return results


def render_pipeline(p: dict) -> list[str]:
    lines = [
        f"## Pipeline cost per question ({p['questions']} MedQA-US questions, seed {p['seed']}, `{p['lm']}`, "
        f"{p['threads']} threads; measured {p['date']} by `bench/pipeline.py`)",
        "",
        "| run | method | accuracy | LM calls | cached calls | prompt tokens | completion tokens | seconds |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in ("cold", "warm"):
        for method, m in p[phase].items():
            lines.append(
                f"| {phase} | {method} | {m['accuracy']:.0%} | {m['lm_calls_per_question']} "
                f"| {m['cached_lm_calls_per_question']} | "
                f"{m['prompt_tokens_per_question']:.0f} | {m['completion_tokens_per_question']:.0f} "
                f"| {m['seconds_per_question']:.1f} |"
            )
    lines += [
        "",
        "Per stage, cold (means per question):",
        "",
        "| method | stage | LM calls | prompt tokens | completion tokens | seconds |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for method, m in p["cold"].items():
        for stage, s in m["stages"].items():
            lines.append(
                f"| {method} | {stage} | {s['lm_calls']} | {s['prompt_tokens']:.0f} | {s['completion_tokens']:.0f} "
                f"| {s['seconds']:.2f} |"
            )
    ratio = ", ".join(f"{k.replace('_', ' ')} x{v}" for k, v in p["hcqr_over_simple_rag"].items())
    lines += [
        "",
        f"HCQR relative to Simple RAG (cold): {ratio}.",
        f"Warm cache: {p['warm_lm_calls']} LM calls per question reached the model "
        "(every call served by DSPy's cache).",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in p.get("versions", {}).items()),
        "",
    ]
    return lines


def _phases(d: dict) -> str:
    return "; ".join(
        f"{p['phase']} ({p['date'][:16].replace('T', ' ') + ', ' if p.get('date') else ''}"
        f"load average at start {', '.join(map(str, p['load_average_at_start']))}"
        + (f", {p['seconds']} s" if "seconds" in p else "")
        + (f", other processes {p['other_cpu_seconds']} CPU-s" if "other_cpu_seconds" in p else "")
        + (f", CPU contention {p['cpu_pressure']:.0%}" if p.get("cpu_pressure") is not None else "")
        + ({True: ", LM study paused", False: ", LM study running"}.get(p.get("study_paused"), ""))
        + ")"
        for p in d.get("timed_phases", [])
    )


def render_scale(sc: dict) -> list[str]:
    """The scale section (``bench/scale.py``): faiss index types x corpus sizes, query runtimes, MedCorp."""
    lines = [
        f"## Retrieval at scale: faiss index types, query runtimes, MedCorp (measured {sc['date']} on {sc['machine']} "
        f"by `bench/scale.py`)",
        "",
    ]
    if sc.get("quick"):
        lines += ["**Quick run (`--quick`).**", ""]
    if len(sc["datasets"]) < len(sc.get("planned", sc["datasets"])):
        lines += [f"**Partial run: {', '.join(sc['datasets'])} of {', '.join(sc['planned'])}.**", ""]
    for _label, d in sc["datasets"].items():
        if d["kind"] == "synthetic":
            lines += [
                f"The {d['passages']:,}-passage corpus is synthetic, made from the {d['source_passages']:,} real "
                f"passages and their real embeddings (`bench/scale_data.py`: {d['recipe']}); nothing was downloaded "
                "or encoded. It is searched with the same real queries.",
                "",
            ]
        elif "encode_passages_per_second" in d:
            lines += [
                f"The {d['passages']:,} real passages were encoded once in this run at "
                f"{d['encode_passages_per_second']} passages/s ({d['encoder']}).",
                "",
            ]
    lines += [
        "Build = from finished embeddings to a saved index, each in its own process (nothing encoded). Bytes per "
        "passage: the faiss file on disk; in RAM, the resident memory the index adds in a fresh process when read by "
        "the product's reader and searched once with every recall query (a memory-mapped refine index: the "
        "pages those searches touched). "
        "Load + search: peak RSS of `load_index` and one 3-query search in a fresh process, above a baseline that "
        "already holds the encoder; *beyond structure* subtracts the index file's bytes (a memory-mapped type: only "
        "its heap bytes, so the mapped pages the load and search touched count) (target: at most "
        f"300 MB; the passage store is memory-mapped). Latency: HCQR's retrieval step (3 queries, k=5 each, "
        f"fused to 15) with PyTorch query encoding; recall@{RECALL_K} against Flat on the real queries.",
        "",
        "| passages | type | factory | search | build s | build passages/s | build peak RSS MB | disk B/passage | "
        "RAM B/passage | load+search added MB | beyond structure MB | p50 ms | p95 ms | encode ms p50 | "
        f"recall@{RECALL_K} |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _label, d in sc["datasets"].items():
        for name, m in d["types"].items():
            opts = ", ".join(f"{k}={v}" for k, v in m["search_options"].items()) or "–"
            lines.append(
                f"| {d['passages']:,} {d['kind']} | {name} | `{m['factory']}` | {opts} | {m['build_seconds']} | "
                f"{m['build_passages_per_second']} | {m['build_peak_rss_mb']} | {m['disk_bytes_per_passage']} | "
                f"{m['ram_bytes_per_passage']} | {m['load_search_added_mb']} | {beyond_structure_mb(m)} | "
                f"{m['search3_fuse_ms_p50']} | {m['search3_fuse_ms_p95']} | {m['encode3_ms_p50']} | "
                f"{m[f'recall_at_{RECALL_K}']} |"
            )
        b = d.get("bm25")
        if b is None:
            continue
        lines.append(
            f"| {d['passages']:,} {d['kind']} | BM25 | bm25s | – | {b['build_seconds']} "
            f"| {b['build_passages_per_second']} | "
            f"{b['build_peak_rss_mb']} | {b['disk_bytes_per_passage']} | (memory-mapped) "
            f"| {b['load_search_added_mb']} | "
            f"– | {b['search3_fuse_ms_p50']} | {b['search3_fuse_ms_p95']} | – | – |"
        )
    for _label, d in sc["datasets"].items():
        lines.append(
            f"\nPassage store ({d['passages']:,} passages, Arrow, memory-mapped): "
            f"{d['passage_store_bytes'] / 1e6:.1f} MB "
            f"on disk. Timed phases: {_phases(d)}."
        )
        dated = {name: m["date"] for name, m in [*d["types"].items(), ("BM25", d.get("bm25", {}))] if m.get("date")}
        if len(set(dated.values())) > 1:
            lines.append(
                f"Rows of {d['passages']:,} {d['kind']} measured at different times (`--types`): "
                + "; ".join(f"{name} {date[:16].replace('T', ' ')}" for name, date in dated.items())
                + "."
            )
    capped = [(d, name, m) for d in sc["datasets"].values() for name, m in d["types"].items() if m.get("capped")]
    if capped:
        lines += [
            "",
            "Memory-capped search (memory-mapped types): every recall query searched alone by a fresh process "
            "that joined a cgroup v1 memory limit of 1/8 of Flat's index bytes after its imports, the index file "
            "evicted from the page cache first, so the structure, every page the searches read and their buffers "
            "are charged against the cap (the kernel reclaims page cache past it and kills the process if it "
            "cannot):",
            "",
            "| passages | type | cap MB | peak charged MB | times at the cap | major faults | recall@15 capped | "
            "recall@15 uncapped | p50 ms / query | p95 ms / query |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for d, name, m in capped:
            c = m["capped"]
            if not c["capped_ok"]:
                lines.append(
                    f"| {d['passages']:,} {d['kind']} | {name} | {c['cap_mb']} | {c['capped_error']} | | | | "
                    f"{m[f'recall_at_{RECALL_K}']} | | |"
                )
                continue
            lines.append(
                f"| {d['passages']:,} {d['kind']} | {name} | {c['cap_mb']} | {c['capped_peak_mb']} | "
                f"{c['capped_limit_hits']} | {c['capped_major_faults']} | {c['capped_recall']} | "
                f"{m[f'recall_at_{RECALL_K}']} | {c['capped_query_ms_p50']} | {c['capped_query_ms_p95']} |"
            )
    lines += _sweep_table(
        sc,
        "recall_by_nprobe",
        "`nprobe` (IVF lists visited",
        "nlist | recall@15 at nprobe = 1, 2, 4 ... nlist",
        lambda sweep: [str(max(map(int, sweep)))],
    )
    lines += _sweep_table(
        sc,
        "recall_by_efSearch",
        "`efSearch` (HNSW candidate list",
        "recall@15 at efSearch = 16, 32 ... 1024",
        lambda sweep: [],
    )
    for _label, d in sc["datasets"].items():
        if d.get("runtimes"):
            when = f"; measured {d['runtimes_date'][:16].replace('T', ' ')}" if d.get("runtimes_date") else ""
            lines += [
                "",
                f"### Query runtimes ({d['passages']:,} real passages; "
                f"exported locally from the packaged weights{when})",
                "",
                "Agreement: mean share of common passage ids in the top 15, against PyTorch on Flat, over the "
                f"{d['recall_queries']} real queries; a runtime is kept only at 0.99 or more.",
                "",
                "| runtime | index | p50 ms | p95 ms | query encoding ms p50 | top-15 agreement | kept |",
                "|---|---|---:|---:|---:|---:|---|",
            ]
            for key, m in d["runtimes"].items():
                runtime, index = key.rsplit(" ", 1)
                flat = d["runtimes"].get(f"{runtime} Flat", {})
                lines.append(
                    f"| {runtime} | {index} | {m['search3_fuse_ms_p50']} | {m['search3_fuse_ms_p95']} "
                    f"| {m['encode3_ms_p50']} | "
                    f"{flat.get('top15_agreement_with_torch', '–')} | {'yes' if flat.get('kept') else 'no'} |"
                )
    mc = sc.get("medcorp")
    if mc:
        lines += [
            "",
            f"### MedCorp extrapolation ({mc['passages']:,} passages, "
            f"from the {mc['from']} measurement's bytes per passage)",
            "",
            "384-d all-MiniLM-L6-v2 vectors, as measured; MedCPT's 768-d vectors would double Flat, HNSW and SQ8 "
            "(PQ's code size is fixed by its factory string).",
            "",
            f"| type | RAM GB | index disk GB | fits in {mc['ram_budget_gb']} GB RAM |",
            "|---|---:|---:|---|",
        ]
        for name, m in mc["types"].items():
            capped = " (the memory cap it ran under)" if m.get("ram_from") == "memory cap" else ""
            lines.append(f"| {name} | {m['ram_gb']}{capped} | {m['index_disk_gb']} | {'yes' if m['fits'] else 'no'} |")
        lines.append(
            f"\nPassage store for {mc['passages']:,} passages: {mc['passage_store_disk_gb']} GB on disk "
            "(memory-mapped, "
            "not RAM)"
            + (
                f"; BM25 score matrix: {mc['bm25_disk_gb']} GB on disk (memory-mapped)."
                if "bm25_disk_gb" in mc
                else "."
            )
        )
    if sc.get("targets"):
        lines += ["", "### Targets (issue 12 point 6)", "", "| target | measured | met |", "|---|---|---|"]
        for t in sc["targets"]:
            lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else '**no**'} |")
    if sc.get("study_paused_seconds"):
        lines.append(
            f"\nThe background LM study was paused for the timed phases: {sc['study_paused_seconds']} s in all."
        )
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in sc["versions"].items()), ""]
    return lines


def _sweep_table(sc: dict, key: str, what: str, header: str, extra) -> list[str]:
    """A recall-only sweep table (``key``: ``recall_by_nprobe`` / ``recall_by_efSearch``), one row per dataset and type;
    ``extra(sweep)`` gives the cells between the type and the sweep."""
    rows = [(d, name, m[key]) for d in sc["datasets"].values() for name, m in d["types"].items() if m.get(key)]
    if not rows:
        return []
    lines = [
        "",
        f"recall@{RECALL_K} against Flat by {what}; recall only, not timed):",
        "",
        f"| passages | type | {header} |",
        "|---:|---|" + "---:|" * (header.count("|")) + "---|",
    ]
    for d, name, sweep in rows:
        lines.append(
            " | ".join(
                [
                    f"| {d['passages']:,} {d['kind']}",
                    name,
                    *extra(sweep),
                    ", ".join(f"{k}: {v}" for k, v in sweep.items()),
                ]
            )
            + " |"
        )
    return lines


def render_milvus(m: dict) -> list[str]:
    """The Milvus section (``bench/milvus.py``): engines x index types per dataset."""
    lines = [
        f"## Milvus vs faiss on the same vectors (measured {m['date']} on {m['machine']} by `bench/milvus.py`)",
        "",
        "Build = insert + index + load from finished embeddings; search = one batched search of HCQR's 3 query "
        "vectors, k=5, fused to 15 (query encoding excluded); recall against faiss exact search; HNSW M=32, "
        "efConstruction=80, ef/efSearch=64."
        + (" **Quick run.**" if m.get("quick") else "")
        + (
            f" Load average at the start: {m['load_average_at_start']} (a shared machine: latencies are noisy)."
            if m.get("load_average_at_start")
            else ""
        )
        + (
            f" **Partial run: {', '.join(m['datasets'])} of {', '.join(m['planned'])}.**"
            if len(m["datasets"]) < len(m.get("planned", m["datasets"]))
            else ""
        ),
        "",
        f"| passages | data | engine | index | build passages/s | p50 ms | p95 ms | recall@{RECALL_K} | disk |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for _label, d in m["datasets"].items():
        for name, f in d["runs"].items():
            engine, kind = name.rsplit(" ", 1)
            engine = f.get("engine", engine)
            lines.append(
                f"| {d['passages']} | {d['kind']} | {engine} | {kind} | {f['build_passages_per_second']} | "
                f"{f['search3_fuse_ms_p50']} | {f['search3_fuse_ms_p95']} | {f[f'recall_at_{RECALL_K}']} | "
                f"{f['disk_bytes'] / 1e6:.1f} MB |"
            )
    for _label, d in m["datasets"].items():
        if d.get("load_average_at_start"):
            lines.append(
                f"\n{d['passages']:,} passages ({d['kind']}) measured {d.get('date', m['date'])}, load average at "
                f"the start {', '.join(map(str, d['load_average_at_start']))}"
                + {True: ", LM study paused.", False: ", LM study running."}.get(d.get("study_paused"), ".")
            )
        if d.get("kind") == "synthetic" and d.get("recipe"):
            lines.append(f"\nThe synthetic set is the one of the scale section (`bench/scale_data.py`: {d['recipe']}).")
    for _label, d in m["datasets"].items():
        if "encode_passages_per_second" in d:
            lines.append(
                f"\nEncoding the {d['passages']} real passages once ({d['encoder']}): "
                f"{d['encode_passages_per_second']} passages/s, shared by every engine."
            )
    if m.get("study_paused_seconds"):
        lines.append(
            f"\nThe background LM study was paused while these were measured: {m['study_paused_seconds']} s in all."
        )
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()), ""]
    return lines
