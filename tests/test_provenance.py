"""Sessions: every `hcqr eval` session that writes rows records its machine and LM stack; compare reports them."""

import json
from importlib import metadata

import pytest
from stub_server import Stub

from hcqr_dspy.errors import LMUnavailableError, RunError
from hcqr_dspy.evaluation.provenance import cpu_model
from hcqr_dspy.evaluation.run_folder import SESSIONS, RunFolder
from hcqr_dspy.lm import build_lm
from hcqr_dspy.reporting import compare
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec


def evaluate_with(bench, stub, name, api_base=None):
    spec = EvalSpec(
        method="cot",
        dataset=str(bench / "qs.json"),
        lm="openai/stub-model",
        api_base=api_base or stub.base,
        api_key_env="STUB_KEY",
        run_dir=str(bench / name),
    )
    lm = build_lm("openai/stub-model", api_base=stub.base, api_key_env="STUB_KEY", cache=False, num_retries=1)
    return run_evaluation(spec, progress=False, track=False, lm=lm)


def test_each_session_that_writes_rows_is_recorded_and_compare_names_the_machines(bench, caplog):
    first = Stub(down_after=3)
    with pytest.raises(LMUnavailableError):
        evaluate_with(bench, first, "run")
    folder = RunFolder(bench / "run")
    [one] = folder.sessions()
    assert (one["session"], one["command"], one["predictions_before"], one["judgments_before"]) == (1, "eval", 0, 0)
    assert one["machine"]["cpu"] == cpu_model() and one["machine"]["cores"] >= 1
    assert one["packages"]["dspy"] == metadata.version("dspy")
    assert one["engine"] is None  # an endpoint, not an in-process llama.cpp engine
    caplog.clear()

    back = Stub()
    evaluate_with(bench, back, "run", api_base=first.base)  # resumed: the second session writes rows 4-6
    assert [(s["session"], s["predictions_before"]) for s in folder.sessions()] == [(1, 0), (2, 3)]
    assert "another machine" not in caplog.text  # resumed on the same machine: no note (logged notes)
    evaluate_with(bench, back, "run", api_base=first.base)  # nothing left to answer: no session recorded
    assert len(folder.sessions()) == 2
    evaluate_with(bench, back, "fresh")
    report, _ = compare([bench / "run", bench / "fresh"], out_dir=bench / "cmp")
    assert "rows written in 2 session(s) on one machine" in report
    assert "rows written in 1 session(s) on one machine" in report

    # a run whose first rows came from another machine, resumed here: a note, and compare names both machines
    gone = Stub(down_after=2)
    with pytest.raises(LMUnavailableError):
        evaluate_with(bench, gone, "other")
    record = json.loads((bench / "other" / SESSIONS).read_text())
    record["machine"]["cpu"] = "Another CPU"
    (bench / "other" / SESSIONS).write_text(json.dumps(record) + "\n")
    evaluate_with(bench, back, "other", api_base=gone.base)
    assert "earlier rows were written on another machine or LM stack (Another CPU" in caplog.text
    back.stop()
    (bench / "fresh" / SESSIONS).unlink()  # a run made before sessions were recorded ...
    RunFolder(bench / "fresh").record_session("judge")  # ... and judged since
    report, _ = compare([bench / "other", bench / "fresh"], out_dir=bench / "cmp")
    assert "rows written in 2 session(s) on 2 different machines or LM stacks" in report and "Another CPU" in report
    assert (
        "6 row(s) written before sessions were recorded (machine unknown); judged in 1 session(s) on one machine"
        in report
    )
    other, fresh = json.loads((bench / "cmp" / "comparison.json").read_text())["sessions"].values()  # reference first
    assert other["sessions"] == 2 and len(other["machines"]) == 2 and "Another CPU" in other["machines"][0]
    assert other["rows_before_sessions"] == 0
    assert (fresh["sessions"], fresh["machines"], fresh["rows_before_sessions"], fresh["judge_sessions"]) == (
        0,
        [],
        6,
        1,
    )

    # rows of a run resumed by the first recorded session are counted as of unknown machine
    lines = (bench / "run" / SESSIONS).read_text().splitlines()
    (bench / "run" / SESSIONS).write_text(lines[1] + "\n")  # only the session that wrote rows 4-6
    report, _ = compare([bench / "run", bench / "fresh"], out_dir=bench / "cmp")
    assert "rows written in 1 session(s) on one machine" in report and "3 row(s) written before sessions" in report


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"command": "eval"}', r"sessions.jsonl:2: not a session record \(no session\)"),
        (
            '{"session": 2, "command": "eval", "machine": "x", "packages": [1], "engine": 5}',
            r"sessions.jsonl: session record 2 has missing or malformed started, machine, packages, engine, "
            r"predictions_before, "
            r"judgments_before \(not written by hcqr-dspy\)",
        ),
        ('{"session": "two"}', r"session record 2 has missing or malformed session, command"),
    ],
)
def test_a_malformed_sessions_file_is_a_clear_error(bench, line, message):
    folder = RunFolder(bench / "run")
    folder.path.mkdir()
    folder.record_session("eval")
    (folder.path / SESSIONS).write_text((folder.path / SESSIONS).read_text() + line + "\n")
    with pytest.raises(RunError, match=message):
        folder.sessions()


def test_a_server_redeployed_with_another_checkpoint_under_the_same_name_is_another_lm_stack(bench, caplog):
    """The server's model card (``GET /v1/models``, vLLM-shaped) is recorded with each session, without the
    fields vLLM fills anew per request; a resume whose server lists another checkpoint is noted, and compare
    counts two LM stacks. A listing without the model is recorded as unavailable, never guessed."""
    first = Stub(down_after=3)
    with pytest.raises(LMUnavailableError):
        evaluate_with(bench, first, "swap")
    [one] = RunFolder(bench / "swap").sessions()
    assert one["endpoint"] == {
        "url": f"{first.base}/models",
        "id": "stub-model",
        "owned_by": "stub",
        "root": "/models/stub-checkpoint-0",
        "parent": None,
        "max_model_len": 4096,
    }
    caplog.clear()
    same = Stub()  # the same checkpoint on another port: the same stack, no note
    with pytest.raises(LMUnavailableError):
        evaluate_with(bench, Stub(down_after=1), "moved")
    evaluate_with(
        bench, same, "moved", api_base=json.loads((bench / "moved" / "config.json").read_text())["lm"]["api_base"]
    )
    assert "another machine" not in caplog.text
    caplog.clear()
    redeployed = Stub(shift=1)  # another checkpoint served under the same model name
    evaluate_with(bench, redeployed, "swap", api_base=first.base)
    err = caplog.text
    assert "earlier rows were written on another machine or LM stack" in err
    assert "root /models/stub-checkpoint-0" in err and "root /models/stub-checkpoint-1" in err
    report, _ = compare([bench / "swap", bench / "moved"], out_dir=bench / "cmp")
    assert "rows written in 2 session(s) on 2 different machines or LM stacks" in report
    assert "rows written in 2 session(s) on one machine" in report

    # the card is read when the LM is built: a listing without the model, a server gone, a provider's endpoint
    assert build_lm("openai/other-model", api_base=same.base, cache=False).hcqr_endpoint_card == {
        "url": f"{same.base}/models",
        "unavailable": "'other-model' is not among the models it lists",
    }
    same.stop()
    card = build_lm("openai/stub-model", api_base=same.base, cache=False).hcqr_endpoint_card
    assert card["unavailable"].startswith("URLError")
    assert build_lm("openai/stub-model", cache=False).hcqr_endpoint_card is None  # a provider's own: not asked
    redeployed.stop()
