"""CPU contention per question: the PSI reading and its share of a question's wall time, the row field an
evaluation writes, the metrics over it, and the report's warning when runs' seconds were measured under unlike
contention."""

import json
import multiprocessing
import os
import time

import pytest
from helpers import comparison_row
from test_compiled_report import write_run
from test_evaluate import CountingCoT, lm_answering, questions, run

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation import cpu_pressure
from hcqr_dspy.evaluation.cpu_pressure import PSI_CPU, PressureWindow, cpu_stall_us
from hcqr_dspy.evaluation.metrics import summarize
from hcqr_dspy.reporting import compare, metrics_table

PSI = "some avg10=1.00 avg60=0.50 avg300=0.10 total={some}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n"


def test_the_some_total_is_read_and_anything_else_is_none(tmp_path):
    psi = tmp_path / "cpu"
    psi.write_text(PSI.format(some=3806193, full=17))
    assert cpu_stall_us(psi) == 3806193
    assert cpu_stall_us(tmp_path / "absent") is None
    for text in ("", "full avg10=0.00 total=5\n", "some avg10=1.0 total=x\n", "some avg10=1.0\n"):
        psi.write_text(text)
        assert cpu_stall_us(psi) is None, text


def test_the_share_is_the_stall_over_the_wall_time(tmp_path):
    psi = tmp_path / "cpu"
    psi.write_text(PSI.format(some=1_000_000, full=0))
    window = PressureWindow(psi)
    window.start -= 2.0  # opened two seconds ago
    psi.write_text(PSI.format(some=2_000_000, full=0))  # one more second of stall since
    assert window.share() == pytest.approx(0.5, abs=0.002)
    psi.write_text(PSI.format(some=9_000_000, full=0))  # more stall than wall time (rounding): at most 1
    assert window.share() == 1.0
    psi.write_text(PSI.format(some=5, full=0))  # the counter went back (another machine, a reboot): unknown
    assert window.share() is None
    psi.unlink()
    assert window.share() is None
    assert PressureWindow(tmp_path / "absent").share() is None


def _spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(not PSI_CPU.exists(), reason="this kernel has no pressure stall information (/proc/pressure/cpu)")
def test_the_machines_real_pressure_rises_when_its_cores_are_oversubscribed():
    assert isinstance(cpu_stall_us(), int)
    window = PressureWindow()
    spinners = [multiprocessing.Process(target=_spin, args=(1.0,)) for _ in range(3 * (os.cpu_count() or 1))]
    for p in spinners:
        p.start()
    for p in spinners:
        p.join()
    assert window.share() > 0.3  # three busy processes a core: someone waits most of the time


def test_an_evaluation_records_each_questions_pressure_and_the_metrics_weigh_it_by_seconds(tmp_path, monkeypatch):
    lm = lm_answering(lambda i: "A")
    reads = iter(range(0, 10**9, 250_000))  # each reading 0.25 s of stall after the last: a contended machine
    monkeypatch.setattr(cpu_pressure, "cpu_stall_us", lambda path=None: next(reads))
    result = run(CountingCoT(), questions(3), tmp_path / "contended", lm)
    rows = [json.loads(line) for line in (tmp_path / "contended" / "predictions.jsonl").read_text().splitlines()]
    assert all(r["cpu_pressure"] is not None and 0 < r["cpu_pressure"] <= 1 for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    weighted = sum(r["cpu_pressure"] * r["seconds"] for r in rows) / seconds
    assert result.metrics["mean_cpu_pressure"] == pytest.approx(weighted)
    assert result.metrics["cpu_pressure_rows"] == 3
    monkeypatch.setattr(cpu_pressure, "cpu_stall_us", lambda path=None: None)  # a kernel without PSI
    result = run(CountingCoT(), questions(3), tmp_path / "unmeasured", lm)
    rows = [json.loads(line) for line in (tmp_path / "unmeasured" / "predictions.jsonl").read_text().splitlines()]
    assert [r["cpu_pressure"] for r in rows] == [None] * 3
    assert "mean_cpu_pressure" not in result.metrics and "cpu_pressure_rows" not in result.metrics


def test_the_metrics_weigh_each_rows_share_by_its_seconds():
    rows = [
        comparison_row("q0", "cot", True, seconds=1.0, cpu_pressure=0.0),
        comparison_row("q1", "cot", True, seconds=3.0, cpu_pressure=0.8),
        comparison_row("q2", "cot", True, seconds=5.0),  # measured nothing: not in the share
    ]
    m = summarize(rows)
    assert m["mean_cpu_pressure"] == pytest.approx(0.6) and m["cpu_pressure_rows"] == 2
    table = metrics_table([("cot", m), ("calm", {**m, "mean_cpu_pressure": 0.05})])
    assert table.splitlines()[-1].startswith("s/q measured under CPU contention") and "cot 60%" in table
    assert "calm" not in table.splitlines()[-1]


def _with_pressure(folder, shares):
    """Give the rows of a written run the CPU pressure ``shares`` (one per row, or one for all)."""
    path = folder / "predictions.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i, row in enumerate(rows):
        row["cpu_pressure"] = shares[i] if isinstance(shares, list) else shares
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _section_note(report):
    return next((p for p in report.split("\n\n") if p.startswith("**Seconds and CPU contention:**")), None)


def test_the_report_warns_when_seconds_were_measured_under_unlike_contention(tmp_path):
    rows = [i % 2 == 0 for i in range(12)]
    calm = _with_pressure(write_run(tmp_path / "calm", "simple_rag", rows, [0.5] * 12), 0.02)
    also_calm = _with_pressure(write_run(tmp_path / "also", "hcqr", rows, [0.5] * 12), 0.05)
    busy = _with_pressure(write_run(tmp_path / "busy", "cot", rows, [0.5] * 12), [0.6] * 6 + [None] * 6)
    bare = write_run(tmp_path / "bare", "no_context", rows, [0.5] * 12)
    report, _ = compare([calm, also_calm], out_dir=tmp_path / "quiet")
    assert _section_note(report) is None  # both measured little contention
    report, _ = compare([calm, also_calm, busy], out_dir=tmp_path / "loud")
    note = _section_note(report)
    assert "simple_rag 2%; hcqr 5%; cot 60% (6/12 questions measured)" in note
    runs = json.loads((tmp_path / "loud" / "comparison.json").read_text())["runs"]
    assert runs["cot"]["mean_cpu_pressure"] == pytest.approx(0.6) and runs["cot"]["cpu_pressure_rows"] == 6
    report, _ = compare([calm, bare], out_dir=tmp_path / "half")
    assert "no_context not measured" in _section_note(report)
    other = write_run(tmp_path / "other", "cot", rows, [0.5] * 12)
    report, _ = compare([bare, other], out_dir=tmp_path / "none")  # nothing measured: nothing said
    assert _section_note(report) is None


@pytest.mark.parametrize("value", [1.5, -0.1, "high", True])
def test_a_row_with_a_malformed_pressure_is_refused_in_one_line(tmp_path, value):
    rows = [i % 2 == 0 for i in range(12)]
    calm = write_run(tmp_path / "calm", "simple_rag", rows, [0.5] * 12)
    odd = _with_pressure(write_run(tmp_path / "odd", "hcqr", rows, [0.5] * 12), [value] + [0.1] * 11)
    with pytest.raises(HCQRError, match=r"the row of question 'q0' has cpu_pressure=.*not a share from 0 to 1"):
        compare([calm, odd], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
