"""`hcqr compare` reads each compared run's saved program once: over a zero-shot run and two seed runs of one
compile (and a second evaluation of one of those programs, its folder spelled another way), each program folder's
meta.json and program.json are opened once for the whole report, its plots included, while the report still
gives each program's compile cost, compile seed and instructions-and-demos diff from those files."""

import json

import numpy as np
from test_compiled_report import N, write_run
from test_saved_program_reads import opens_in

from hcqr_dspy.cli import main
from hcqr_dspy.optimize.recipes import load_recipe
from hcqr_dspy.optimize.saved import NoRetriever, save_program
from hcqr_dspy.programs import make_program


def seed_program(folder, seed):
    """A saved simple_rag program of compile seed ``seed``: one labelled demo on each predictor, a compile cost."""
    program = make_program("simple_rag", NoRetriever())
    for _, predictor in program.named_predictors():
        predictor.demos = [{"question": f"Demo question of seed {seed}?", "options": "A. yes\nB. no", "answer": "A"}]
    recipe = load_recipe("bootstrap_fewshot").model_copy(update={"seed": seed}).record()
    cost = {"lm_calls": 10.0 + seed, "prompt_tokens": 900.0, "completion_tokens": 100.0, "seconds": 60.0}
    return save_program(program, folder, optimizer="BootstrapFewShot", recipe=recipe, compile_cost=cost)


def test_compare_opens_each_saved_programs_files_once(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(11)
    zs = [bool(x) for x in rng.integers(0, 2, N)]
    p = list(rng.uniform(0.05, 0.95, N))
    programs = {s: seed_program(tmp_path / "programs" / f"seed-{s}", s) for s in (0, 1)}
    record = {"optimizer": "BootstrapFewShot", "recipe": "bootstrap_fewshot"}  # no seed: read from meta.json
    runs = [write_run(tmp_path / "sr", "simple_rag", zs, p)]
    for name, folder in (
        ("bfs_0", str(programs[0])),
        ("bfs_1", str(programs[1])),
        ("bfs_0_again", str(tmp_path / "programs" / "seed-1" / ".." / "seed-0")),  # one folder, another spelling
    ):
        flipped = [not x if i % (3 + len(runs)) == 0 else x for i, x in enumerate(zs)]
        # the second evaluation of seed 0 is named another recipe: one arm holding a seed twice is refused
        again = {"recipe": "bootstrap_fewshot rerun"} if name == "bfs_0_again" else {}
        runs.append(write_run(tmp_path / name, "simple_rag", flipped, p, {"folder": folder, **record, **again}))
    opened = {s: opens_in(monkeypatch, folder) for s, folder in programs.items()}
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, runs), "--out", str(out), "--no-mlflow"]) == 0
    monkeypatch.undo()
    assert {s: sorted(names) for s, names in opened.items()} == {
        0: ["meta.json", "program.json"],
        1: ["meta.json", "program.json"],
    }
    capsys.readouterr()
    report = (out / "comparison.md").read_text()
    summary = json.loads((out / "comparison.json").read_text())
    assert "| 10 calls, 1,000 tokens, 60 s |" in report and "| 11 calls, 1,000 tokens, 60 s |" in report
    assert summary["replicates"]["simple_rag + bootstrap_fewshot"]["seeds"] == [0, 1]
    assert "Demo question of seed 1? ... (answer='A')" in report  # program.json's demos, in the program diff
    assert "demos 0 -> 1 shown (0 bootstrapped, 1 labelled)" in report  # counted from the built program
    assert (out / "compiled.png").is_file()
