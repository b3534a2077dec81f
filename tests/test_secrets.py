"""Secrets never printed or stored: a gateway that echoes the refused key, endpoint URLs carrying credentials,
log records, and MLflow's telemetry (off unless the user turns it on)."""

import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from stub_server import OPTIONS, SECRET, Stub
from support.cli_args import eval_argv, stub_args

from hcqr_dspy.cli import main
from hcqr_dspy.redaction import MASK, redact, redact_logging, register_secret


def fresh_questions(bench):
    """Question texts no response cache holds (the stub must be asked)."""
    nonce = uuid.uuid4().hex
    rows = {
        f"q{i}": {"question": f"Question number {i}? ({nonce})", "options": OPTIONS, "answer": "A"} for i in range(6)
    }
    (bench / "qs.json").write_text(json.dumps(rows))


def files_holding(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.parametrize("when", ["at start", "mid-run"])
def test_a_gateway_echoing_the_refused_key_is_masked_in_messages_traces_and_records(bench, mlflow_store, capfd, when):
    fresh_questions(bench)
    stub = Stub(switch_after=3, switch_to="auth_echo") if when == "mid-run" else Stub()
    if when == "at start":
        stub.mode = "auth_echo"
    run_dir, store = bench / "run", Path(mlflow_store)
    code = main(eval_argv(bench, run_dir, *stub_args(stub), "--mlflow-dir", str(store)))
    stub.stop()
    out, err = capfd.readouterr()
    bodies = [json.loads(body) for _, body in stub.seen if body.startswith("{")]
    assert bodies and code == 2
    line = err.strip().splitlines()[-1]
    assert "Incorrect API key provided: ***" in line and SECRET not in out + err
    if when == "mid-run":  # the rows before the refusal are kept; the traces of the run are in the store
        assert "2/6 questions are saved" in line and (store / "mlflow.db").exists()
    # run folder, MLflow database (the spans' exception events), artifacts
    assert files_holding(bench, SECRET) == [] and files_holding(store, SECRET) == []


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--api-base", "http://alice:{s}@127.0.0.1:9/v1"], "user name or password"),
        (["--api-base", "http://127.0.0.1:9/v1?api_key={s}"], "query parameter api_key"),
        (["--api-base", "http://127.0.0.1:9/v1?model=x&Access-Token={s}"], "query parameter Access-Token"),
        (["--api-base", "http://127.0.0.1:1/v1#key={s}"], "a fragment (the part after '#')"),
    ],
)
def test_an_api_base_carrying_credentials_is_refused_in_one_line_without_them(bench, capsys, flags, named):
    flags = [f.format(s=SECRET) for f in flags]
    run_dir = bench / "run"
    code = main(eval_argv(bench, run_dir, "--lm", "openai/stub-model", *flags, "--no-mlflow"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and named in err[0] and "--api-key-env" in err[0]
    assert SECRET not in err[0] and not run_dir.exists()
    code = main(["judge", str(run_dir), "--judge-lm", "openai/stub-model", *flags])  # the judge's endpoint too
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and SECRET not in err[0]


def test_a_reflection_endpoint_carrying_credentials_names_its_own_flags():
    from hcqr_dspy.errors import LMSpecError
    from hcqr_dspy.lm.spec import parse_lm_spec

    with pytest.raises(LMSpecError, match="--reflection-api-base must not carry .* --reflection-api-key-env"):
        parse_lm_spec("openai/x", api_base=f"https://h/v1?key={SECRET}", option="--reflection-lm")
    assert parse_lm_spec("openai/x", api_base="https://h/v1?api-version=2024-06-01").api_base.endswith("01")


def test_redact_masks_registered_values_url_credentials_query_values_and_bearer_tokens():
    register_secret("k3y-value-registered")
    text = (
        "refused k3y-value-registered at https://bob:hunter22@gw.example/v1?api-version=1&api_key=abc123&x=2 "
        "with Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig"
    )
    assert redact(text) == (
        f"refused {MASK} at https://{MASK}@gw.example/v1?api-version=1&api_key={MASK}&x=2 "
        f"with Authorization: Bearer {MASK}"
    )
    ordinary = "token probabilities of the code; key features; a bearer of news; see http://host/v1?model=m"
    assert redact(ordinary) == ordinary


def test_log_records_are_masked_on_every_handler(capfd):
    register_secret(SECRET)
    logger = logging.getLogger("hcqr_test_litellm_like")
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        redact_logging()
        logger.warning("Retrying: Incorrect API key provided: %s", SECRET)
        try:
            raise RuntimeError(f"refused {SECRET}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    err = capfd.readouterr().err
    assert "Incorrect API key provided: ***" in err and "RuntimeError: refused ***" in err and SECRET not in err


@pytest.mark.parametrize("user_value, expected", [(None, "true"), ("false", "false")])
def test_mlflow_telemetry_is_off_unless_the_user_turns_it_on(user_value, expected):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_DISABLE_TELEMETRY"}
    if user_value is not None:
        env["MLFLOW_DISABLE_TELEMETRY"] = user_value
    code = (
        "import os, hcqr_dspy\n"
        "from mlflow.environment_variables import MLFLOW_DISABLE_TELEMETRY\n"
        "print(os.environ['MLFLOW_DISABLE_TELEMETRY'], MLFLOW_DISABLE_TELEMETRY.get())"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [expected, str(expected == "true")]


def test_an_address_urllib_cannot_read_is_still_checked_for_credentials():
    from hcqr_dspy.errors import LMSpecError
    from hcqr_dspy.lm.spec import parse_lm_spec

    assert parse_lm_spec("hosted_vllm/m", api_base="http://[::1").api_base == "http://[::1"  # its use reports it
    with pytest.raises(LMSpecError, match="user name or password"):
        parse_lm_spec("hosted_vllm/m", api_base=f"http://bob:{SECRET}@[::1/v1")
