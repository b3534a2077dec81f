"""A compile records the setup it ran on and the setups of the cached replies it was served (``meta.json``'s
``compile_setup``), DSPy's worker threads included; ``hcqr compare`` compares compiled runs' compile setups, so
seeds of one optimizer arm compiled on different setups are flagged, and refused by ``--strict-setup``."""

import json
from pathlib import Path

import dspy
import pytest
from stub_server import Stub
from test_compiled_report import N, write_run
from test_optimize import setup, spec  # noqa: F401 - setup is a fixture
from test_setups import other_versions, own_cache, stub_lm  # noqa: F401 - own_cache is a fixture

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.cpu_pressure import PSI_CPU
from hcqr_dspy.lm.reply_setup import cached_reply_setups
from hcqr_dspy.reporting import compare
from hcqr_dspy.workflows.compile import run_compile


def stub_spec(setup, stub, out):  # noqa: F811
    return spec(
        setup,
        method="simple_rag",
        lm="openai/stub-model",
        api_base=stub.base,
        api_key_env="STUB_KEY",
        program_options={"budget": 3},
        out=str(setup / "programs" / out),
    )


def test_a_compile_records_its_setup_and_whose_cached_replies_it_was_served(setup, own_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("STUB_KEY", "sk-stub")
    stub = Stub()
    try:
        first = run_compile(stub_spec(setup, stub, "first"), track=False, lm=stub_lm(stub))
        recorded = json.loads((Path(first["out"]) / "meta.json").read_text())["compile_setup"]
        session = recorded["session"]
        assert session["command"] == "compile" and session["lm"]["model"] == "openai/stub-model"
        assert session["endpoint"]["root"] == "/models/stub-checkpoint-0" and recorded["cached_setups"] == []
        asked = stub.count
        assert asked > 0
        cost = json.loads((Path(first["out"]) / "meta.json").read_text())["compile_cost"]
        if PSI_CPU.exists():  # the machine's contention over the compile, a share of its seconds
            assert 0 <= cost["cpu_pressure"] <= 1 and first["compile_cost"] == cost
        else:
            assert "cpu_pressure" not in cost
        with monkeypatch.context() as m:  # another dspy version: the same requests, answered from the cache
            other_versions(m)
            again = run_compile(stub_spec(setup, stub, "again"), track=False, lm=stub_lm(stub))
        assert stub.count == asked
        redone = json.loads((Path(again["out"]) / "meta.json").read_text())["compile_setup"]
        assert redone["session"]["reply_setup"] != session["reply_setup"]
        [entry] = redone["cached_setups"]
        assert entry["setup"] == session["reply_setup"] and entry["calls"] == asked
        assert entry["record"]["packages"]["dspy"] != "3.9.0"
    finally:
        stub.stop()


def test_replies_served_in_dspys_worker_threads_are_collected(bench, own_cache):  # noqa: F811
    stub = Stub()
    try:
        lm = stub_lm(stub)
        ask = dspy.Predict("question -> answer")
        with dspy.context(lm=lm):
            for i in range(4):
                ask(question=f"Question number {i}?")  # cached
            asked, calls = stub.count, len(lm.history)
            with cached_reply_setups() as cached:
                dspy.Parallel(num_threads=2)([(ask, {"question": f"Question number {i}?"}) for i in range(4)])
        assert stub.count == asked  # every reply from the cache, each one counted once
        assert [e["calls"] for e in cached.summary()] == [len(lm.history) - calls] and len(lm.history) - calls >= 4
    finally:
        stub.stop()


def seed_folder(root, seed, fingerprint, cached=(), record=None):
    """A saved program's folder whose meta.json holds a compile setup (``fingerprint`` None: none recorded;
    ``record``: that record as given)."""
    folder = root / "programs" / f"seed-{seed}"
    folder.mkdir(parents=True)
    if record is None and fingerprint is not None:
        record = {
            "session": {"command": "compile", "reply_setup": fingerprint},
            "cached_setups": [{"setup": c, "calls": 2} for c in cached],
        }
    (folder / "meta.json").write_text(json.dumps({} if record is None else {"compile_setup": record}))
    return {"folder": str(folder), "recipe": "bootstrap_fewshot", "seed": seed, "train_dataset": "medmcqa"}


def test_seeds_compiled_on_different_setups_are_flagged_and_refused(tmp_path):
    zero = write_run(tmp_path / "zs", "simple_rag", [i % 2 == 0 for i in range(N)], [0.5] * N)
    same = [
        write_run(
            tmp_path / f"s{s}",
            "simple_rag",
            [i % 3 == 0 for i in range(N)],
            [0.6] * N,
            seed_folder(tmp_path / f"a{s}", s, "aaaa"),
        )
        for s in range(2)
    ]
    report, _ = compare([zero, *same], out_dir=tmp_path / "one")
    assert "ran on one setup" in report and "compile setup aaaa" in report
    other = write_run(
        tmp_path / "s2",
        "simple_rag",
        [i % 3 == 0 for i in range(N)],
        [0.6] * N,
        seed_folder(tmp_path / "b", 2, "aaaa", cached=("aaaa", "bbbb")),
    )
    report, _ = compare([zero, *same, other], out_dir=tmp_path / "two")
    assert "differ in compile setup" in report.split("\n\n")[1]
    setups = json.loads((tmp_path / "two" / "comparison.json").read_text())["setups"]
    assert any("compile setup" in pair["fields"] for pair in setups["pairs"])
    with pytest.raises(
        HCQRError, match=r"--strict-setup: runs .* differ in compile setup \(aaaa vs aaaa \+ cached bbbb\)"
    ):
        compare([zero, *same, other], out_dir=tmp_path / "strict", strict_setup=True)


@pytest.mark.parametrize(
    "record, shown",
    [
        (None, "not recorded"),  # a program saved before programs recorded their compile setup
        ({"session": {"reply_setup": "aaaa"}, "cached_setups": [{"setup": {"a": 1}}]}, "malformed record"),
        ({"session": {"reply_setup": "aaaa"}, "cached_setups": "bbbb"}, "malformed record"),
        ({"session": "aaaa"}, "malformed record"),
        ("aaaa", "malformed record"),
    ],
)
def test_a_seed_without_a_readable_compile_setup_beside_one_with_it_is_flagged(tmp_path, record, shown):
    rows = [i % 3 == 0 for i in range(N)]
    zero = write_run(tmp_path / "zs", "simple_rag", [i % 2 == 0 for i in range(N)], [0.5] * N)
    one = write_run(tmp_path / "s0", "simple_rag", rows, [0.6] * N, seed_folder(tmp_path / "a", 0, "aaaa"))
    other = seed_folder(tmp_path / "b", 1, None, record=record)
    two = write_run(tmp_path / "s1", "simple_rag", rows, [0.6] * N, other)
    report, _ = compare([zero, one, two], out_dir=tmp_path / "out")
    assert "differ in compile setup" in report.split("\n\n")[1]
    with pytest.raises(HCQRError, match=rf"differ in compile setup \(aaaa vs {shown}\)"):
        compare([zero, one, two], out_dir=tmp_path / "strict", strict_setup=True)


def test_programs_none_of_which_records_a_compile_setup_are_not_compared_on_it(tmp_path):
    rows = [i % 3 == 0 for i in range(N)]
    zero = write_run(tmp_path / "zs", "simple_rag", [i % 2 == 0 for i in range(N)], [0.5] * N)
    seeds = [
        write_run(tmp_path / f"s{s}", "simple_rag", rows, [0.6] * N, seed_folder(tmp_path / f"a{s}", s, None))
        for s in range(2)
    ]
    report, _ = compare([zero, *seeds], out_dir=tmp_path / "out", strict_setup=True)
    recorded = next(line for line in report.split("## Setups")[1].splitlines() if "Recorded for every run" in line)
    assert "ran on one setup" in recorded and "compile setup" not in recorded
