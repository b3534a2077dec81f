"""Secrets kept out of messages and records: API keys, URL credentials, credential-like query parameters.

A key is read only from the variable ``--api-key-env`` names (:func:`hcqr_dspy.lm.dspy_lm.build_lm`), and its
value is registered here (:func:`register_secret`) so that any text about to be printed or recorded can be
cleaned of it (:func:`redact`), even where a gateway echoes it back in an error ("Incorrect API key provided:
Bearer sk-..."). Besides registered values, :func:`redact` masks what has a secret's form in any text: the
user-info of a URL (``http://alice:PASSWORD@host`` -> ``http://***@host``), query parameters whose name is a
credential's (``?api_key=...``, ``&token=...``, :data:`CREDENTIAL_PARAMETERS`) and bearer tokens.

An endpoint URL that carries credentials is refused before it is used (:func:`check_endpoint_url`): it would be
recorded with every run, as a Milvus URI would (:mod:`hcqr_dspy.retrieval.milvus.settings` refuses those).
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import parse_qsl, urlsplit

from hcqr_dspy.errors import LMSpecError

MASK = "***"
# Query-parameter names that carry credentials (lower case, '-' read as '_'): OpenAI-style gateways, Azure's
# api-key, signed URLs (sig, signature, x-amz-signature), OAuth (access_token, client_secret, code).
CREDENTIAL_PARAMETERS = frozenset(
    {
        *("key", "api_key", "apikey", "x_api_key", "token", "access_token", "auth", "auth_token", "authorization"),
        *("secret", "client_secret", "password", "passwd", "pwd", "sig", "signature", "x_amz_signature", "code"),
        *("session_token", "refresh_token", "id_token", "private_token", "credential", "credentials"),
    }
)
# Shortest registered secret masked as a value (a key shorter than this would mask ordinary words).
MIN_SECRET_CHARS = 6

_SECRETS: set[str] = set()
_LOCK = threading.Lock()
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s@?#\"'<>]+)@")
_QUERY = re.compile(r"(?P<lead>[?&;](?P<name>[A-Za-z0-9_\-]+)=)(?P<value>[^&;#\s\"'<>]+)")
_BEARER = re.compile(r"(?i)(?P<lead>\bbearer\s+)(?P<value>[A-Za-z0-9\-._~+/]{8,}=*)")


def credential_parameter(name: str) -> bool:
    """Whether a query parameter's name is a credential's (:data:`CREDENTIAL_PARAMETERS`, any case, ``-`` as ``_``)."""
    return name.lower().replace("-", "_") in CREDENTIAL_PARAMETERS


def register_secret(value: str | None) -> None:
    """Remember a secret's value (an API key read from its variable) so that :func:`redact` masks it anywhere."""
    if value and len(value.strip()) >= MIN_SECRET_CHARS:
        with _LOCK:
            _SECRETS.add(value.strip())


def redact(text: str) -> str:
    """``text`` with every registered secret, URL user-info, credential-like query value and bearer token
    replaced by ``***``."""
    if not text:
        return text
    with _LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = _QUERY.sub(lambda m: m["lead"] + MASK if credential_parameter(m["name"]) else m[0], text)
    return _BEARER.sub(lambda m: m["lead"] + MASK, text)


def redact_exception(exc: BaseException) -> BaseException:
    """Mask secrets in ``exc`` and the exceptions it chains (``__cause__``, ``__context__``) in place: their
    ``args`` and text attributes (``message``), so that what prints or records them (a traceback, an MLflow span's
    exception event) shows the masked text. Returns ``exc``."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        try:
            current.args = tuple(redact(a) if isinstance(a, str) else a for a in current.args)
            for name, value in list(vars(current).items()):
                if isinstance(value, str) and redact(value) != value:
                    setattr(current, name, redact(value))
        except (AttributeError, TypeError):  # an exception type with read-only args or slots: left as it is
            pass
        stack += [current.__cause__, current.__context__]
    return exc


def check_endpoint_url(url: str | None, option: str = "--api-base", key_option: str = "--api-key-env") -> None:
    """Refuse an endpoint URL that carries credentials: user-info (``http://user:pass@host``), a query parameter
    named like one (``?api_key=...``), or a fragment (``#key=...``: never sent to the endpoint, so nothing but a
    place to hide a secret); they would be recorded with every run.

    Raises:
        LMSpecError: naming the option and where the key belongs instead (the value itself is not shown).
    """
    if not url:
        return
    try:
        parts = urlsplit(url)
        netloc, query = parts.netloc, parts.query
    except ValueError:  # not a URL urllib can read ("http://[::1"): its use fails and is reported there
        netloc, query = url.split("//", 1)[-1].split("/", 1)[0], url.partition("?")[2]
    if "@" in netloc:
        raise LMSpecError(
            f"{option} must not carry credentials (user name or password before '@'); they would be recorded with "
            f"the run: put the key in an environment variable and name it with {key_option}"
        )
    named = sorted({name for name, _ in parse_qsl(query, keep_blank_values=True) if credential_parameter(name)})
    if named:
        raise LMSpecError(
            f"{option} must not carry credentials (query parameter {', '.join(named)}); they would be recorded "
            f"with the run: put the key in an environment variable and name it with {key_option}"
        )
    if "#" in url:
        raise LMSpecError(
            f"{option} must not carry a fragment (the part after '#'): it is never sent to the endpoint and would be "
            f"recorded with the run; put a key in an environment variable and name it with {key_option}"
        )


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets in a record's message (its arguments merged in first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            redact_exception(record.exc_info[1])
            record.exc_text = None
        return True


_FILTER = RedactingFilter()


def redact_logging() -> None:
    """Mask secrets in every log record this process prints: the filter on each handler of the root logger and of
    the loggers that hold their own (DSPy's, LiteLLM's, MLflow's), and on Python's last-resort handler."""
    handlers = list(logging.getLogger().handlers) + [logging.lastResort]
    for logger in list(logging.Logger.manager.loggerDict.values()):
        handlers += getattr(logger, "handlers", [])
    for handler in handlers:
        if handler is not None and _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
