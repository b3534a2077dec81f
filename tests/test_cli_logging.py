"""Notes go through the ``hcqr_dspy`` logger: the command prints them on stderr as they read (``-q`` keeps only
cautions and errors, ``-v`` adds debug lines), and a library user gets them as log records."""

import json
import logging

import pytest

from hcqr_dspy.cli import main

LOADED = "loaded 8 passages from "  # `hcqr index`'s line saying what it did (INFO)


def index_argv(tiny_corpus_file, out, *flags):
    return [*flags, "index", "--corpus", str(tiny_corpus_file), "--retriever", "bm25", "--out", str(out)]


def test_quiet_hides_what_the_command_is_doing_and_keeps_errors(tmp_path, tiny_corpus_file, capsys):
    assert main(index_argv(tiny_corpus_file, tmp_path / "a")) == 0
    assert LOADED in capsys.readouterr().err
    assert main(index_argv(tiny_corpus_file, tmp_path / "b", "-q")) == 0
    assert capsys.readouterr().err == ""  # no line, no progress bar
    # after the subcommand too
    assert main([*index_argv(tiny_corpus_file, tmp_path / "c"), "--quiet"]) == 0
    assert LOADED not in capsys.readouterr().err
    # the one-line error stays whatever the level
    missing = tmp_path / "missing.jsonl"
    assert main(["-q", "index", "--corpus", str(missing), "--retriever", "bm25", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hcqr: error: ") and not (tmp_path / "d").exists()
    # the command leaves the logger as it found it
    assert logging.getLogger("hcqr_dspy").handlers == [] and logging.getLogger("hcqr_dspy").level == logging.NOTSET


def test_verbose_shows_debug_lines(tmp_path, tiny_corpus_file, capsys):
    assert main(index_argv(tiny_corpus_file, tmp_path / "a")) == 0
    assert "hcqr index: hcqr-dspy " not in capsys.readouterr().err
    assert main(index_argv(tiny_corpus_file, tmp_path / "b", "-v")) == 0
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith("hcqr index: hcqr-dspy ") and "(dspy " in line for line in err), err
    assert any(line.startswith(LOADED) for line in err)
    with pytest.raises(SystemExit) as stop:
        main(index_argv(tiny_corpus_file, tmp_path / "c", "-v", "-q"))
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_a_library_user_gets_the_notes_as_log_records(tmp_path, caplog, capsys):
    """No command line: :func:`~hcqr_dspy.workflows.judge.judge_and_track` of a run without retrieval says so
    through logging (a WARNING of ``hcqr_dspy.workflows.judge``), and prints nothing itself."""
    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.workflows.judge import judge_and_track

    (tmp_path / "bench.json").write_text(
        json.dumps({"d1": {"question": "Yellow vision?", "options": {"A": "Digoxin", "B": "Graves"}, "answer": "A"}})
    )
    base = {"dataset": str(tmp_path / "bench.json"), "lm": {"spec": "local:no-such-model"}}  # never loaded
    cot = RunFolder.create(tmp_path / "cot", {**base, "method": "cot"})
    cot.predictions.append({"qid": "d1", "passages": []})
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="hcqr_dspy"):
        assert judge_and_track(cot.path, track=False) is None
    said = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("hcqr_dspy")]
    assert said == [
        (
            "hcqr_dspy.workflows.judge",
            logging.WARNING,
            f"{cot.path}: no question has a retrieved context (method cot): nothing to judge",
        )
    ]
    assert capsys.readouterr().err == ""  # pytest holds the root logger's handlers: Python prints nothing itself
