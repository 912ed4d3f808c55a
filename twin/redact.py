"""Keep secrets out of logs, error texts, stored rows and API answers.

A webhook or Slack URL *is* its secret (the path carries the token), so every URL the project
logs or stores in an error text is cut to ``scheme://host[:port]`` by :func:`redact_url`;
:func:`redact_text` does that to every URL inside a text and blanks known secret values
(routing keys, header values, the API token, the MQTT password) as ``***``.

Secrets the service holds are registered with :func:`register_secret`; the
:class:`RedactingFilter` that ``dctwin serve`` puts on its log handlers applies
:func:`redact_text` with them to every log line, so even a library's line (httpx logs each
request's full URL at INFO) cannot carry one::

    >>> redact_url("https://hooks.slack.com/services/T000/B000/XXXX?x=1")
    'https://hooks.slack.com'
    >>> redact_text("POST https://user:pw@events.example:8443/v2/enqueue failed")
    'POST https://events.example:8443 failed'
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = [
    "MASK",
    "RedactingFilter",
    "install_log_redaction",
    "redact_text",
    "redact_url",
    "register_secret",
    "registered_secrets",
]

MASK = "***"
#: Secrets shorter than this are not registered for log-wide blanking (they would blank
#: ordinary words); the components that hold them never log them in the first place.
MIN_SECRET_LEN = 6

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
_secrets: set[str] = set()
_lock = threading.Lock()


def redact_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: no user, password, path, query or fragment."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:
        return "<url>"
    if not parts.scheme or not host:
        return "<url>"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def register_secret(value: str | None) -> None:
    """Blank ``value`` in every log line from now on (see :class:`RedactingFilter`)."""
    if value and len(value) >= MIN_SECRET_LEN:
        with _lock:
            _secrets.add(value)


def registered_secrets() -> list[str]:
    with _lock:
        return sorted(_secrets, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every URL cut by :func:`redact_url` and every secret value (those given
    and the registered ones) replaced by ``***``."""
    out = _URL.sub(lambda m: redact_url(m.group(0)), text)
    values = {s for s in secrets if s} | set(registered_secrets())
    for s in sorted(values, key=len, reverse=True):
        out = out.replace(s, MASK)
    return out


class RedactingFilter(logging.Filter):
    """A handler filter: the record's message (and traceback) pass through :func:`redact_text`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record: let the handler report it as usual
            return True
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Put one :class:`RedactingFilter` on every handler of ``logger`` (default: root)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
