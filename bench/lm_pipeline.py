"""LM-path efficiency: the product's seconds per stage against raw llama.cpp's for the same tokens, the HCQR / Simple
RAG wall-time ratio and a per-method cost table, from the run folders of one ``hcqr demo``.

Usage:
    python bench/lm_pipeline.py [--runs DIR | --limit 10 --lm local [--keep DIR]] [--lengths 256,512,...] [--out FILE]

Without ``--runs`` it runs ``hcqr demo --limit N`` (the default 1.5B model; HCQR, CoT and Simple RAG on the demo
questions) into a temporary folder (``--keep``: a folder kept for reading the rows later) with an empty DSPy cache, so
that every reply is generated; with ``--runs`` it reads the run folders a demo wrote into DIR. Rows with a reply from
the response cache are left out and counted. Each model and build keeps its own section; another build is measured by
running this script with that build's unpacked wheel first on ``PYTHONPATH`` (as ``bench/lm.py`` does).

Raw reference, measured in this process with the engine settings and context window the runs' sessions recorded
(refused if this process's differ): llama.cpp's seconds to prefill N prompt tokens from an empty KV cache
(``Llama.eval``) and its seconds per generated token after N prompt tokens (greedy argmax, one ``Llama.eval`` a
token), at each N of ``--lengths``, best of two. A call of P prompt and C completion tokens is predicted to take
``prefill(P) + C * token(P + C / 2)`` (piecewise-linear between the measured lengths); a stage's efficiency is its
predicted over its measured seconds, summed over its calls. Above 1 the product evaluated fewer prompt tokens than
it sent (its prompt cache resumed a prefix); below 1, time went to sampling, the grammar, templating or Python, or
the machine ran slower during the run than while the raw rates were measured (on a shared 2-core machine the same call
can take 20% longer minutes later); ``bench/lm_overhead.py`` measures the overhead alone, each call paired with raw
llama.cpp right after it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
METHODS = ("cot", "simple_rag", "hcqr")
GEN_TOKENS = 32


def read_runs(runs: Path) -> tuple[dict[str, list[dict]], dict, dict[str, int]]:
    """Rows per method of the demo run folders in ``runs``, their engine record and the rows left out (cached)."""
    rows, engines, skipped = {}, [], {}
    for method in METHODS:
        folders = sorted(runs.glob(f"{method}-*"))
        if len(folders) != 1:
            raise SystemExit(f"bench: {runs} needs exactly one {method}-* run folder (found {len(folders)})")
        kept = []
        for line in (folders[0] / "predictions.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row.get("cached_lm_calls"):
                skipped[method] = skipped.get(method, 0) + 1
            else:
                kept.append(row)
        rows[method] = kept
        sessions = [json.loads(s) for s in (folders[0] / "sessions.jsonl").read_text().splitlines()]
        engines += [s["engine"] for s in sessions if s.get("engine")]
    config = json.loads((folders[0] / "config.json").read_text())
    if not engines or any(e != engines[0] for e in engines):
        raise SystemExit("bench: the runs were made with different (or unrecorded) engine settings")
    return rows, {**engines[0], "lm": config["lm"]["model"]}, skipped


def raw_seconds(model: str, n_ctx: int, lengths: list[int], recorded: dict) -> dict:
    """Seconds to prefill each length and seconds per generated token after it, on the in-process engine; refused
    (``SystemExit``) before measuring if its settings and build are not the ``recorded`` ones."""
    from hcqr_dspy.lm import EngineSettings, LlamaCppEngine, packaged_model_path

    engine = LlamaCppEngine(packaged_model_path(model), n_ctx=n_ctx, settings=EngineSettings.from_env())
    here = {**engine.settings.record(), "build": engine.build}
    if here != {k: recorded.get(k) for k in here}:
        raise SystemExit(f"bench: the runs' engine settings {recorded} differ from this process's {here}")
    llm = engine.llm
    text = (REPO / "data" / "demo" / "corpus.jsonl").read_text()
    pool = llm.tokenize(text.encode(), add_bos=False)
    prefill, per_token = {}, {}
    for n in lengths:
        best_p = best_g = float("inf")
        for _ in range(2):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(pool[:n])
            t1 = time.perf_counter()
            for _ in range(GEN_TOKENS):
                logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
                llm.eval([int(logits.argmax())])
            best_p, best_g = min(best_p, t1 - t0), min(best_g, (time.perf_counter() - t1) / GEN_TOKENS)
        prefill[n], per_token[n] = best_p, best_g
    engine.close()
    return {"prefill_s": prefill, "token_s": per_token}


def predicted(raw: dict, prompt: float, completion: float) -> float:
    """Raw llama.cpp seconds for one call of ``prompt`` and ``completion`` tokens (see the module docstring)."""
    xs = sorted(raw["prefill_s"])
    pre = np.interp(prompt, [0, *xs], [0.0, *(raw["prefill_s"][x] for x in xs)])
    if prompt > xs[-1]:  # past the longest length: its rate
        pre = raw["prefill_s"][xs[-1]] * prompt / xs[-1]
    tok = np.interp(prompt + completion / 2, xs, [raw["token_s"][x] for x in xs])
    return float(pre + completion * tok)


def summarise(rows: dict[str, list[dict]], raw: dict) -> dict:
    """Per method: the cost table row and, per stage, measured and predicted seconds and their ratio."""
    out = {}
    for method, kept in rows.items():
        stages: dict[str, dict] = {}
        for row in kept:
            for name, st in (row.get("stages") or {}).items():
                calls = st.get("lm_calls") or 0
                if not calls:
                    continue
                s = stages.setdefault(name, {"calls": 0, "prompt": 0, "completion": 0, "seconds": 0.0, "raw": 0.0})
                s["calls"] += calls
                s["prompt"] += st["prompt_tokens"]
                s["completion"] += st["completion_tokens"]
                s["seconds"] += st["seconds"]
                s["raw"] += calls * predicted(raw, st["prompt_tokens"] / calls, st["completion_tokens"] / calls)
        for s in stages.values():
            s["efficiency"] = round(s["raw"] / s["seconds"], 3)
            s["product_tokens_per_s"] = round((s["prompt"] + s["completion"]) / s["seconds"], 1)
            s["raw_tokens_per_s"] = round((s["prompt"] + s["completion"]) / s["raw"], 1)
            s["seconds"], s["raw"] = round(s["seconds"], 1), round(s["raw"], 1)
        n = len(kept)
        seconds = [r["seconds"] for r in kept]
        out[method] = {
            "questions": n,
            "accuracy": round(sum(bool(r["correct"]) for r in kept) / n, 3) if n else None,
            "lm_calls": round(sum(r["lm_calls"] for r in kept) / n, 2) if n else None,
            "prompt_tokens": round(sum(r["prompt_tokens"] for r in kept) / n) if n else None,
            "completion_tokens": round(sum(r["completion_tokens"] for r in kept) / n) if n else None,
            "seconds_mean": round(float(np.mean(seconds)), 1) if n else None,
            "seconds_median": round(float(np.median(seconds)), 1) if n else None,
            "efficiency": round(sum(s["raw"] for s in stages.values()) / sum(seconds), 3) if n else None,
            "stages": stages,
        }
    return out


def section_key(model: str, build: str) -> str:
    """The results key of a model and llama.cpp build's section (``lm_pipeline/<model>/<build>``), so each pair
    keeps its own."""
    return f"lm_pipeline/{model}/{build}"


def run_demo(runs: Path, limit: int, lm: str, *extra: str) -> None:
    """``hcqr demo --limit N --lm LM --runs runs [extra]`` with an empty response cache (every reply generated)."""
    env = {**os.environ, "DSPY_CACHEDIR": str(runs / "dspy-cache")}
    cmd = [
        sys.executable,
        "-m",
        "hcqr_dspy.cli",
        "demo",
        "--limit",
        str(limit),
        "--lm",
        lm,
        "--runs",
        str(runs),
        *extra,
    ]
    cmd += ["--index", str(runs / "index"), "--mlflow-dir", str(runs / "mlruns")]
    subprocess.run(cmd, env=env, check=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=None, help="folder of an `hcqr demo` run (default: run one now)")
    ap.add_argument("--limit", type=int, default=10, help="demo questions when it runs the demo itself")
    ap.add_argument("--lm", default="local", help="a packaged model (local, local:<name>) when it runs the demo")
    ap.add_argument("--keep", default=None, help="run the demo into this new folder and keep it (default: temporary)")
    ap.add_argument("--lengths", default="256,512,1024,2048,3072,4096")
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from report import checked_out, write_results

    out_path = checked_out(ap, args.out)  # refused before measuring
    if args.keep and (args.runs or Path(args.keep).exists()):
        raise SystemExit(f"bench: --keep needs a new folder and no --runs ({args.keep} exists or --runs given)")
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(args.runs or args.keep or tmp)
        demo_seconds = None
        if not args.runs:
            print(f"bench: lm pipeline: hcqr demo --limit {args.limit} --lm {args.lm} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            run_demo(runs, args.limit, args.lm)
            demo_seconds = round(time.perf_counter() - t0)
        rows, engine, skipped = read_runs(runs)
    model = engine["lm"].removeprefix("llama_cpp/")  # a packaged model's name (the config's llama_cpp/<name>)
    print(f"bench: lm pipeline: raw llama.cpp rates of {model} ...", file=sys.stderr, flush=True)
    recorded = {k: v for k, v in engine.items() if k not in ("lm", "system_info", "n_ctx")}
    raw = raw_seconds(model, engine["n_ctx"], [int(n) for n in args.lengths.split(",")], recorded)
    methods = summarise(rows, raw)
    section = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": f"`hcqr demo --limit {args.limit} --lm {args.lm}` run by this script" if not args.runs else args.runs,
        "demo_seconds": demo_seconds,
        "model": model,
        "engine": {**recorded, "n_ctx": engine["n_ctx"]},
        "left_out_cached": skipped,
        "raw": {k: {str(n): round(v, 4) for n, v in raw[k].items()} for k in ("prefill_s", "token_s")},
        "methods": methods,
    }
    if methods["simple_rag"]["seconds_mean"]:
        section["hcqr_over_simple_rag"] = round(
            methods["hcqr"]["seconds_mean"] / methods["simple_rag"]["seconds_mean"], 2
        )
    write_results(out_path, section, key=section_key(model, engine["build"]))
    print(f"bench: wrote {out_path} and {out_path.with_name('RESULTS.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
