"""A real OpenAI-compatible LM server on 127.0.0.1: llama-cpp-python's own (its ``server`` extra), for tests.

``python -m llama_cpp.server`` (llama-cpp-python 0.3.36, ``llama_cpp/server/``) serves one GGUF model over the
OpenAI chat-completions API with FastAPI and uvicorn; the ``llm`` extra of pyproject.toml installs its
dependencies (``llama-cpp-python[server]``: uvicorn, fastapi, sse-starlette, starlette-context,
pydantic-settings). hcqr reaches it as it reaches vLLM or any other endpoint: ``--lm hosted_vllm/<alias>`` or
``--lm openai/<alias>`` with ``--api-base`` :attr:`LocalLlamaServer.base`.

It is started to compute as hcqr's in-process engine (:class:`hcqr_dspy.lm.llama_cpp.LlamaCppEngine`) does, so
the two can be compared reply for reply:

* the same ``Llama`` class, so the same chat template (no ``--chat_format``: the GGUF's own
  ``tokenizer.chat_template``, as the engine renders it) and the same sampler chain (repetition penalty, then
  greedy at temperature 0; the server's default ``repeat_penalty`` is 1.1, the engine's
  :data:`~hcqr_dspy.lm.llama_cpp.DEFAULT_REPEAT_PENALTY`; its ``last_n_tokens_size`` 64, llama-cpp-python's);
* the engine's settings (:class:`~hcqr_dspy.lm.engine_settings.EngineSettings` from the environment): ``n_batch``,
  ``n_ubatch``, flash attention, the prompt cache (``HCQR_PROMPT_CACHE_MB``: the server's ``--cache`` with a
  ``LlamaRAMCache`` of the same capacity, so each prompt resumes from the same kept state), ``n_threads`` and
  ``n_threads_batch`` (``$HCQR_N_THREADS``, default 1 here: a test server shares the machine), and ``n_ctx``
  (:data:`~hcqr_dspy.lm.llama_cpp.DEFAULT_N_CTX`), ``seed`` 0, ``logits_all`` off (the engine's generating instance
  keeps no logits either; the server's default is on).

One setting cannot be given: the server loads with llama.cpp's default model parameters, whose
``use_extra_bufts`` (weight repacking) is on, while the engine's default is off on AVX-512 builds
(``HCQR_EXTRA_BUFTS``). Repacking changes the arithmetic only of the quantisation types llama.cpp repacks
(Q4_0, Q4_K, IQ4_NL ...), not SmolLM2-135M's Q4_1.

:meth:`LocalLlamaServer.stop` ends the server's whole process group (SIGTERM, then SIGKILL) and checks none of it
is left.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.tracking.ui import die_with_parent
from support import process_group

SERVER_MODULES = ("uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
DEFAULT_MODEL = "smollm2-135m"  # the smallest packaged model
PORT_ATTEMPTS = 3  # a free port can be taken by another process before the server binds it


class LlamaServerError(HCQRError):
    """The llama-cpp-python server could not be set up, started or stopped (the message says why)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_server_modules() -> list[str]:
    """The modules of llama-cpp-python's ``server`` extra that are not installed (``llama_cpp`` included)."""
    return [m for m in ("llama_cpp", *SERVER_MODULES) if importlib.util.find_spec(m) is None]


class LocalLlamaServer(process_group.ServerProcess):
    """One ``python -m llama_cpp.server`` process on 127.0.0.1, serving one GGUF model under ``alias``.

    Args:
        model: A packaged model's name (default the smallest) or a GGUF path.
        alias: The model name the API serves (default: the packaged name, or the file's stem).
        n_ctx: Context window (default: the in-process engine's).
        startup_timeout: Seconds to wait for the model to load and the API to answer.

    Example:
        >>> with LocalLlamaServer() as server:
        ...     main(["eval", ..., "--lm", f"hosted_vllm/{server.alias}", "--api-base", server.base])
    """

    def __init__(
        self,
        model: str | Path = DEFAULT_MODEL,
        alias: str | None = None,
        n_ctx: int | None = None,
        startup_timeout: float = 120.0,
    ):
        self.model = model
        self.alias = alias or (Path(model).stem if Path(str(model)).suffix == ".gguf" else str(model))
        self.n_ctx = n_ctx
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.startup_seconds: float | None = None
        self._log_dir: Path | None = None

    @property
    def base(self) -> str:
        """The API base, ``http://127.0.0.1:PORT/v1``."""
        if self.port is None:
            raise LlamaServerError("the llama-cpp-python server is not started")
        return f"http://127.0.0.1:{self.port}/v1"

    def model_path(self) -> Path:
        """The GGUF file served.

        Raises:
            LlamaServerError: a packaged model that is not installed, or no such file.
        """
        from hcqr_dspy.lm import LMSpecError, packaged_model_path

        if Path(str(self.model)).suffix == ".gguf":
            path = Path(self.model)
        else:
            try:
                path = packaged_model_path(str(self.model))
            except LMSpecError as exc:
                raise LlamaServerError(f"packaged model {self.model!r}: {exc}") from None
        if not path.is_file():
            raise LlamaServerError(f"no GGUF file at {path}")
        return path

    def command(self, port: int) -> list[str]:
        """The server's command line (the settings the module's notes give)."""
        from hcqr_dspy.lm.engine_settings import EngineSettings
        from hcqr_dspy.lm.llama_cpp import DEFAULT_N_CTX

        threads = int(os.environ.get("HCQR_N_THREADS") or 1)
        cfg = EngineSettings.from_env(threads)
        flag = {True: "true", False: "false"}
        return [
            *(sys.executable, "-m", "llama_cpp.server", "--model", str(self.model_path())),
            *("--model_alias", self.alias, "--host", "127.0.0.1", "--port", str(port)),
            *("--n_ctx", str(self.n_ctx or DEFAULT_N_CTX), "--seed", "0"),
            *("--n_threads", str(cfg.n_threads), "--n_threads_batch", str(cfg.n_threads)),
            *("--n_batch", str(cfg.n_batch), "--n_ubatch", str(cfg.n_ubatch)),
            *("--flash_attn", flag[cfg.flash_attn], "--logits_all", "false", "--verbose", "false"),
            *(
                ("--cache", "true", "--cache_type", "ram", "--cache_size", str(cfg.prompt_cache_mb << 20))
                if cfg.prompt_cache_mb
                else ("--cache", "false")
            ),
        ]

    def start(self) -> str:
        """Start the server and wait until it serves the model; return :attr:`base`.

        Raises:
            LlamaServerError: the extra or the model is missing, the process exited, or it did not answer
                within ``startup_timeout`` (the last line of its log is quoted).
        """
        if self.process is not None:
            return self.base
        missing = missing_server_modules()
        if missing:
            raise LlamaServerError(
                f"llama-cpp-python's server extra is not installed (no {', '.join(missing)}): make setup-model-135m"
            )
        self._log_dir = Path(tempfile.mkdtemp(prefix="hcqr-llama-server-"))
        for _attempt in range(PORT_ATTEMPTS):
            port = _free_port()
            log = self._log_dir / f"server-{port}.log"
            t0 = time.monotonic()
            with log.open("wb") as out:
                self.process = subprocess.Popen(
                    self.command(port),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=die_with_parent,  # a test run killed outright (no teardown) leaves no server
                )
            self.port = port
            try:
                self._wait_ready(t0, log)
            except LlamaServerError:
                taken = b"address already in use" in log.read_bytes().lower()
                if taken:
                    self._stop_process()
                    continue
                self.stop()
                raise
            except BaseException:
                self.stop()
                raise
            self.startup_seconds = time.monotonic() - t0
            return self.base
        self.stop()
        raise LlamaServerError(f"no free port could be bound in {PORT_ATTEMPTS} tries")

    def _wait_ready(self, t0: float, log: Path) -> None:
        last = "no answer"
        while time.monotonic() - t0 < self.startup_timeout:
            if self.process.poll() is not None:
                raise LlamaServerError(
                    f"the server exited with code {self.process.returncode} while starting: {_last_line(log)}"
                )
            try:
                with urllib.request.urlopen(f"{self.base}/models", timeout=2) as reply:
                    if self.alias in [m.get("id") for m in json.load(reply).get("data", [])]:
                        return
                    last = f"{self.alias!r} not among its models"
            except OSError as exc:  # not up yet: connection refused
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.25)
        raise LlamaServerError(
            f"the server did not serve {self.alias!r} within {self.startup_timeout:.0f} s ({last}): {_last_line(log)}"
        )

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server's process group (SIGTERM, SIGKILL after ``timeout`` s) and remove its logs. Safe twice.

        Raises:
            LlamaServerError: a process of its group survived SIGKILL.
        """
        self._stop_process(timeout)
        if self._log_dir is not None:
            for f in self._log_dir.glob("*"):
                f.unlink(missing_ok=True)
            self._log_dir.rmdir()
            self._log_dir = None

    def _stop_process(self, timeout: float = 20.0) -> None:
        proc, self.process = self.process, None
        process_group.stop_group(proc, timeout, LlamaServerError, "the llama-cpp-python server")
        self.port = None


def running_or_skip(server: LocalLlamaServer):
    """Start ``server`` and give its address, stopping it on the way out; when it cannot start, skip the test
    that asked for it, saying why (:func:`support.process_group.running_or_skip`)."""
    return process_group.running_or_skip(server, LlamaServerError, "the llama-cpp-python server")


def _last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    return f"last line of its log: {lines[-1][:300]}" if lines else "its log is empty"
