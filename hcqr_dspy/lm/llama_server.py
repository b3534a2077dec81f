"""One GGUF model served over the OpenAI chat-completions API by llama-cpp-python's own server, computing as the
in-process engine does: ``python -m hcqr_dspy.lm.llama_server --model FILE --alias NAME --port PORT ...``.

The process runs ``llama_cpp.server`` (llama-cpp-python 0.3.36's FastAPI app, ``create_app``, under uvicorn;
its ``server`` extra: uvicorn, fastapi, sse-starlette, starlette-context, pydantic-settings) on 127.0.0.1 with
the model loaded as :class:`~hcqr_dspy.lm.llama_cpp.LlamaCppEngine` loads it: the same ``Llama`` class, chat
template (the GGUF's own), context window, seed 0, ``logits_all`` off and
:class:`~hcqr_dspy.lm.engine_settings.EngineSettings` (threads, ``n_batch``, ``n_ubatch``, flash attention, weight
repacking, given as JSON by :func:`server_command`; repacking, which the server's own flags cannot set, through the
same model-parameter hook as the engine), its prompt cache a ``LlamaRAMCache`` of the same capacity, and the
engine's greedy grammar sampler (:func:`hcqr_dspy.lm.grammar_sampling.install`).

Two things of a chat request are adapted before llama-cpp-python reads it (:func:`adapt_chat_request`), so that
clients written for OpenAI's API (MLflow's judges) are answered as hcqr's own LMs answer:

* ``response_format`` ``{"type": "json_schema", "json_schema": {"schema": S}}`` (OpenAI's structured output)
  becomes ``{"type": "json_object", "schema": S}``, the dialect llama-cpp-python takes (it refuses the former
  with HTTP 500, which clients retry) and turns into grammar-constrained decoding of ``S``;
* a request without ``temperature`` gets 0 (hcqr's LMs' temperature; the server's own default is 0.8).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hcqr_dspy.lm.engine_settings import EngineSettings

SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
"""The modules the server needs: llama-cpp-python and its ``server`` extra."""
CHAT_PATH = "/v1/chat/completions"


def missing_modules() -> list[str]:
    """The modules of :data:`SERVER_MODULES` that are not installed."""
    import importlib.util

    return [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]


def server_command(model: Path, alias: str, port: int, n_ctx: int, settings: EngineSettings) -> list[str]:
    """The command line that serves ``model`` as ``alias`` on ``127.0.0.1:port`` (``settings`` fully resolved:
    ``use_extra_bufts`` not ``None``)."""
    return [
        *(sys.executable, "-m", "hcqr_dspy.lm.llama_server", "--model", str(model), "--alias", alias),
        *("--port", str(port), "--n-ctx", str(n_ctx), "--settings", json.dumps(settings.record())),
    ]


def adapt_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A chat-completions request body as llama-cpp-python's server takes it (the module's list); other bodies
    unchanged."""
    out = dict(body)
    rf = out.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema")
        out["response_format"] = {"type": "json_object", **({"schema": schema} if isinstance(schema, dict) else {})}
    out.setdefault("temperature", 0.0)
    return out


class AdaptChatRequests:
    """ASGI middleware: the body of ``POST /v1/chat/completions`` passed through :func:`adapt_chat_request` (a body
    that is not a JSON object goes on unchanged, for the server to refuse)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") != CHAT_PATH:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nothing to answer
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            parsed = json.loads(body)
            if isinstance(parsed, dict):
                body = json.dumps(adapt_chat_request(parsed)).encode()
        except ValueError:
            pass
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        delivered = False

        async def replay() -> dict:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app({**scope, "headers": headers}, replay, send)


def build_app(model: Path, alias: str, port: int, n_ctx: int, settings: EngineSettings) -> Any:
    """llama-cpp-python's server app with the model loaded (the module's settings) and :class:`AdaptChatRequests`.

    Raises:
        Exception: whatever llama-cpp-python raises for a file it cannot load (``ValueError``).
    """
    import llama_cpp.server.app as server_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    from hcqr_dspy.lm import grammar_sampling
    from hcqr_dspy.lm.llama_cpp import extra_bufts, save_state_without_scores

    model_settings = ModelSettings(
        model=str(model),
        model_alias=alias,
        n_ctx=n_ctx,
        seed=0,
        n_threads=settings.n_threads,
        n_threads_batch=settings.n_threads,
        n_batch=settings.n_batch,
        n_ubatch=settings.n_ubatch,
        flash_attn=settings.flash_attn,
        logits_all=False,
        cache=settings.prompt_cache_mb > 0,
        cache_type="ram",
        cache_size=settings.prompt_cache_mb << 20,
        verbose=False,
    )
    with extra_bufts(bool(settings.use_extra_bufts)):
        app = server_app.create_app(
            server_settings=ServerSettings(host="127.0.0.1", port=port), model_settings=[model_settings]
        )
    llm = server_app._llama_proxy()  # the model create_app loaded
    grammar_sampling.install(llm)
    if settings.prompt_cache_mb:
        llm.save_state = lambda: save_state_without_scores(llm)
    app.add_middleware(AdaptChatRequests)
    return app


def main(argv: list[str] | None = None) -> int:
    """Serve one model until SIGTERM or SIGINT (the module's command line); exit 1 with one line on stderr when
    the extra is missing or the model cannot be loaded."""
    parser = argparse.ArgumentParser(prog="python -m hcqr_dspy.lm.llama_server")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--alias", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, required=True)
    parser.add_argument("--settings", required=True, help="EngineSettings.record() as JSON")
    args = parser.parse_args(argv)
    missing = missing_modules()
    if missing:
        print(f"llama-cpp-python's server extra is not installed (no {', '.join(missing)})", file=sys.stderr)
        return 1
    settings = EngineSettings(**json.loads(args.settings))
    try:
        app = build_app(args.model, args.alias, args.port, args.n_ctx, settings)
    except Exception as exc:  # llama-cpp-python's ValueError for a file it cannot load, an OSError ...
        print(f"cannot load {args.model}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}", file=sys.stderr)
        return 1
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
