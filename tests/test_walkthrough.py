"""docs/walkthrough.md runs as written: every `hcqr` command of its fenced bash blocks, in order, in a fresh folder
(the demo data linked in as `data/demo`), with the page's `--lm local:smollm2-135m` swapped for the stub
OpenAI-compatible server of stub_server.py, so the page is checked in seconds and the same way every time.
`hcqr ui` (a server that runs until stopped) is parsed, not run."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from stub_server import SECRET, Stub
from support.cli_args import stub_args

from hcqr_dspy.cli import main
from hcqr_dspy.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "walkthrough.md"
PAGE_LM = ["--lm", "local:smollm2-135m"]  # what every command of the page that asks an LM gives
SET_UP = {"make", "source", "export"}  # the page's other lines: set-up the test does not run


def page_commands(text: str) -> list[list[str]]:
    """The commands of a Markdown page's fenced bash blocks, in order, each as its argv (``\\``-continued lines
    joined, ``#`` comments dropped)."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if argv := shlex.split(line, comments=True):
                commands.append(argv)
    return commands


def page_lm_at(argv: list[str]) -> int | None:
    """Where ``argv`` gives the page's ``--lm local:smollm2-135m``; ``None`` when it does not."""
    return next((i for i in range(len(argv) - 1) if argv[i : i + 2] == PAGE_LM), None)


def swap_lm(argv: list[str], lm: list[str]) -> list[str]:
    """``argv`` with the page's ``--lm local:smollm2-135m`` replaced by ``lm`` (unchanged without it)."""
    at = page_lm_at(argv)
    return argv if at is None else [*argv[:at], *lm, *argv[at + 2 :]]


def run(argv: list[str], capsys) -> tuple[int, str]:
    """``hcqr argv`` in this process: its exit code (argparse's too) and what it printed."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refusing a flag
        code = exc.code
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_pages_commands_are_the_walkthrough_on_the_135m_model():
    commands = page_commands(PAGE.read_text(encoding="utf-8"))
    assert {argv[0] for argv in commands} <= {"hcqr", *SET_UP}, "a line the page test neither runs nor knows"
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for argv in commands:
        if argv[0] == "make":
            assert all(re.search(rf"^{re.escape(t)}:", makefile, flags=re.MULTILINE) for t in argv[1:]), argv
    steps = [argv[1] for argv in commands if argv[0] == "hcqr"]
    assert steps[:3] == ["split", "index", "eval"] and steps[-1] == "ui"
    assert {"compile", "compare", "prompts"} <= set(steps)
    asking = [shlex.join(argv) for argv in commands if argv[0] == "hcqr" and argv[1] in ("eval", "compile")]
    assert len(asking) == 5 and [a for a in asking if page_lm_at(shlex.split(a)) is None] == []
    build_parser().parse_args(next(argv[1:] for argv in commands if argv[1:2] == ["ui"]))


@pytest.fixture
def stub():
    server = Stub()
    yield server
    server.stop()


def test_the_walkthrough_runs_top_to_bottom(tmp_path, monkeypatch, stub, capsys):
    monkeypatch.setenv("STUB_KEY", SECRET)
    for name in ("MLFLOW_TRACKING_URI", "HCQR_MLFLOW_DIR"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "demo").symlink_to(REPO / "data" / "demo")
    monkeypatch.chdir(tmp_path)
    ran = []
    for argv in page_commands(PAGE.read_text(encoding="utf-8")):
        if argv[0] != "hcqr" or argv[1] == "ui":
            continue
        argv = swap_lm(argv[1:], stub_args(stub))
        code, printed = run(argv, capsys)
        assert code == 0, f"`hcqr {shlex.join(argv)}` exited {code}:\n{printed[-3000:]}"
        ran.append((argv[0], printed))
    assert [step for step, _ in ran].count("eval") == 3 and stub.count > 0
    split = json.loads((tmp_path / "splits" / "demo" / "split.json").read_text(encoding="utf-8"))
    assert {p: len(v["ids"]) for p, v in split["parts"].items()} == {"train": 10, "val": 4, "test": 6}
    for run_dir in ("zero-shot", "bootstrapped", "labelled"):
        metrics = json.loads((tmp_path / "runs" / "walkthrough" / run_dir / "metrics.json").read_text())
        assert metrics["n"] == 6, run_dir
    report = (tmp_path / "runs" / "walkthrough" / "comparison" / "comparison.md").read_text(encoding="utf-8")
    assert "hcqr+bootstrap_fewshot" in report and "hcqr+labeled_fewshot" in report
    prompts = [printed for step, printed in ran if step == "prompts"]
    assert prompts[1].startswith("walkthrough-hcqr.answer v1  aliases: zero-shot  demos: 0")  # one version
    assert "## system" in prompts[1] and "## user" not in prompts[1]
    assert prompts[2].startswith("--- walkthrough-hcqr.answer v2\n+++ walkthrough-hcqr.answer v3\n")
    # `hcqr prompts NAME zero-shot bootstrapped`: what BootstrapFewShot changed, demos added to the same instructions
    diff = prompts[3].splitlines()
    assert diff[:2] == ["--- walkthrough-hcqr.answer v1", "+++ walkthrough-hcqr.answer v2"]
    assert "+## user" in diff and not [line for line in diff[2:] if line.startswith("-")]
