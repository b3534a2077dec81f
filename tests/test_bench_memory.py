"""The memory benchmark (bench/eval_memory.py): the real ``hcqr eval`` in a child process against the stub LM, its
RSS sampled as rows come, the store's size and span text per question, all rendered into RESULTS.md."""

import json
from pathlib import Path

import pytest
from helpers import load_bench_module

BENCH = Path(__file__).resolve().parents[1] / "bench"  # on sys.path below: the script imports its sibling `report`


def test_the_memory_bench_samples_a_real_eval_and_renders_its_figures(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    bench = load_bench_module("eval_memory")
    out = tmp_path / "results.json"
    assert bench.main(["--questions", "20", "--every", "10", "--traces", "light", "--out", str(out)]) == 0
    section = json.loads(out.read_text())["eval_memory/cot/light"]
    assert [s["questions"] for s in section["samples"]][-1] == 20 and section["rss_kb_at"]["1"] > 0
    assert section["spans"]["traces"] == 20 and section["store_bytes_per_question"] > 0
    assert section["peak_rss_kb"] >= section["peak_rss_kb_loop"] > 0
    assert set(section["spans"]["top_spans"]) == {"cot", "answer"}  # light: no DSPy spans
    report = (tmp_path / "RESULTS.md").read_text()
    assert f"| cot | light | – | 20 | {section['machine']['nproc']} cores" in report
    assert "- eval_memory/cot/light: cot " in report


def test_the_slope_is_fitted_from_a_thousand_questions_or_a_fifth_of_a_shorter_run():
    bench = load_bench_module("eval_memory")
    samples = [{"questions": q, "rss_kb": 500_000 + (0 if q < 1000 else 4 * q)} for q in (1, 500, 1000, 1500, 2000)]
    assert bench.slope_kb_per_question(samples, 20_000) == 4.0  # the start-up before 1,000 questions is left out
    short = [{"questions": q, "rss_kb": 1000 + 2 * q} for q in (1, 50, 100)]
    assert bench.slope_kb_per_question(short, 100) == 2.0 and bench.slope_kb_per_question(short[:1], 100) is None


def test_a_keep_folder_that_exists_is_refused_in_one_line_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    bench = load_bench_module("eval_memory")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("a user's file")
    with pytest.raises(SystemExit) as refused:
        bench.main(["--questions", "3", "--keep", str(kept), "--out", str(tmp_path / "results.json")])
    assert refused.value.code == 2
    assert f"--keep {kept} exists" in capsys.readouterr().err.splitlines()[-1]
    assert [p.name for p in kept.iterdir()] == ["mine.txt"] and not (tmp_path / "results.json").exists()
