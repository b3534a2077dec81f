"""A local judge LM (``local``, ``local:<name>``, ``gguf:<path>``) served over HTTP for MLflow's judges, for the
judging only.

MLflow's judges call a model by URI over HTTP (:mod:`hcqr_dspy.tracking.retrieval_judges`), and hcqr runs a local
model in-process. :func:`served_endpoint` therefore starts llama-cpp-python's own OpenAI-compatible server
(:mod:`hcqr_dspy.lm.llama_server`) on 127.0.0.1 at a free port, with the model file the spec resolves to (a
packaged model assembled and checked as for ``--lm``, or the ``gguf:`` file) and the in-process engine's settings
(``--n-ctx``, :class:`~hcqr_dspy.lm.engine_settings.EngineSettings` from the environment: ``HCQR_N_THREADS``,
``HCQR_N_BATCH``, ``HCQR_N_UBATCH``, ``HCQR_FLASH_ATTN``, ``HCQR_EXTRA_BUFTS``, ``HCQR_PROMPT_CACHE_MB``, repacking
defaulting per llama.cpp build as in the engine), waits until ``GET /v1/models`` lists the model, and gives the
:class:`~hcqr_dspy.tracking.retrieval_judges.JudgeEndpoint` ``openai:/<alias>`` at ``http://127.0.0.1:PORT/v1``
with the file's name, SHA-256 and the settings (recorded with the judging). The server runs in its own process
group, with ``PR_SET_PDEATHSIG`` (it gets SIGTERM if hcqr dies), its log in a temporary folder; on every exit of the
block (done, an error, Ctrl-C) the whole group gets SIGTERM, then SIGKILL, and the log folder is removed.

A remote spec gets :func:`~hcqr_dspy.tracking.retrieval_judges.judge_endpoint` and nothing is started.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from hcqr_dspy.errors import LMSpecError
from hcqr_dspy.lm import llama_server
from hcqr_dspy.lm.engine_settings import EngineSettings, build_features, default_extra_bufts
from hcqr_dspy.lm.llama_cpp import DEFAULT_N_CTX
from hcqr_dspy.lm.model_file import gguf_sha256, require_gguf_file
from hcqr_dspy.lm.packaged import packaged_model_path
from hcqr_dspy.lm.spec import LMConfig
from hcqr_dspy.tracking import retrieval_judges as rj
from hcqr_dspy.tracking.ui import die_with_parent, stop_process_group

STARTUP_TIMEOUT_S = 300.0
"""Seconds the server may take to load the model and answer ``/v1/models``."""
PORT_ATTEMPTS = 3
"""Free ports tried: one can be taken by another program between finding it and the server binding it."""


def model_file(cfg: LMConfig) -> Path:
    """The GGUF file of a local spec.

    Raises:
        LMSpecError: a packaged model not installed or failing its checksum
            (:func:`~hcqr_dspy.lm.packaged.packaged_model_path`), or no file at a ``gguf:`` path.
    """
    path = packaged_model_path(cfg.model.split("/", 1)[1]) if cfg.kind == "packaged" else Path(cfg.path or "")
    return require_gguf_file(path, f"--judge-lm {cfg.spec}: ").resolve()


def engine_settings() -> tuple[EngineSettings, str]:
    """The engine's settings from the environment with repacking resolved for this llama.cpp build, and the
    build's kernels (:func:`~hcqr_dspy.lm.engine_settings.build_features`).

    Raises:
        LMSpecError: a setting variable that is not valid.
    """
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    build = build_features(info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info))
    settings = EngineSettings.from_env()
    if settings.use_extra_bufts is None:
        settings = replace(settings, use_extra_bufts=default_extra_bufts(build))
    return settings, build


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    return lines[-1].strip()[:300] if lines else "its log is empty"


def _wait_ready(proc: subprocess.Popen, base: str, alias: str, log: Path, timeout: float) -> str | None:
    """Wait until ``GET base/models`` lists ``alias``: ``None``; the process's last log line if it exited first.

    Raises:
        TimeoutError: no answer within ``timeout`` seconds (what the last try got, and the log's last line).
    """
    t0, last = time.monotonic(), "no answer"
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            return _last_line(log)
        try:
            with urllib.request.urlopen(f"{base}/models", timeout=2) as reply:
                if alias in [m.get("id") for m in json.load(reply).get("data", [])]:
                    return None
                last = f"{alias!r} is not among its models"
        except (OSError, ValueError) as exc:  # not listening yet (connection refused), or not its reply
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise TimeoutError(f"no answer within {timeout:.0f} s ({last}); its log's last line: {_last_line(log)}")


@contextmanager
def served_endpoint(
    cfg: LMConfig, n_ctx: int = DEFAULT_N_CTX, startup_timeout: float = STARTUP_TIMEOUT_S
) -> Iterator[rj.JudgeEndpoint]:
    """The judge LM ``cfg`` as MLflow calls it, within the block; a local one served as the module says.

    Raises:
        LMSpecError: a remote spec MLflow cannot call (:func:`~hcqr_dspy.tracking.retrieval_judges.judge_endpoint`);
            for a local one, the model file missing, llama-cpp-python's server extra not installed, or the server
            exiting (a file llama.cpp cannot load ...) or not answering while it starts: one line naming the spec,
            the file and the server's last log line, nothing started left running.
    """
    if cfg.kind == "litellm":
        yield rj.judge_endpoint(cfg)
        return
    path = model_file(cfg)
    missing = llama_server.missing_modules()
    if missing:
        raise LMSpecError(
            f"--judge-lm {cfg.spec}: serving a local judge LM to MLflow's judges needs llama-cpp-python's server "
            f"extra (no {', '.join(missing)}): run make setup-llm"
        )
    settings, build = engine_settings()
    alias = cfg.model.split("/", 1)[1]
    record = {
        "model_file": path.name,
        "model_sha256": gguf_sha256(path),
        "n_ctx": n_ctx,
        "build": build,
        **settings.record(),
    }
    logs = Path(tempfile.mkdtemp(prefix="hcqr-judge-server-"))
    proc = None
    try:
        for _attempt in range(PORT_ATTEMPTS):
            port = _free_port()
            log = logs / f"{path.name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    llama_server.server_command(path, alias, port, n_ctx, settings),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            base = f"http://127.0.0.1:{port}/v1"
            try:
                exited = _wait_ready(proc, base, alias, log, startup_timeout)
            except TimeoutError as exc:
                raise LMSpecError(
                    f"--judge-lm {cfg.spec}: llama-cpp-python's server for {path} did not start: {exc}; "
                    "nothing was judged"
                ) from None
            if exited is None:
                break
            stop_process_group(proc)
            if "address already in use" not in exited.lower():
                raise LMSpecError(
                    f"--judge-lm {cfg.spec}: llama-cpp-python's server for {path} exited with code "
                    f"{proc.returncode} while starting: {exited}; nothing was judged"
                )
            proc = None
        else:
            raise LMSpecError(f"--judge-lm {cfg.spec}: no free port on 127.0.0.1 in {PORT_ATTEMPTS} tries")
        yield rj.JudgeEndpoint(cfg.spec, f"openai:/{alias}", base, None, model=record)
    finally:
        if proc is not None:
            stop_process_group(proc)
        shutil.rmtree(logs, ignore_errors=True)
