"""Keep secrets out of logs, error texts, stored rows and API answers.

A webhook or Slack URL *is* its secret (the path carries the token), so every URL the project
logs or stores in an error text is cut to ``scheme://host[:port]`` by :func:`redact_url`;
:func:`redact_text` does that to every URL inside a text and blanks known secret values
(routing keys, header values, the API token, the MQTT password) as ``***``.

Secrets the service holds are registered with :func:`register_secret`; the
:class:`RedactingFilter` that ``dctwin serve`` puts on its log handlers applies
:func:`redact_text` with them to every log line, so even a library's line (httpx logs each
request's full URL at INFO) cannot carry one. Not only a whole secret is blanked: any run of
:data:`FRAGMENT_LEN` characters of one is (a parser that quotes 31 of a routing key's 32
characters, a URL path cut short), taken from a URL's user, password, path and query only (its
scheme and host are not secret) and from no path segment that is a plain lower-case word.

A config file that does not parse is reported by :func:`parse_error_text`: the parser's
problem and position, never the text it quotes from the file, and redacted; the values of
secret-looking keys of such a file (:func:`register_config_secrets`) are registered first, so
that even a file the service never loaded cannot leak its secrets::

    >>> redact_url("https://hooks.slack.com/services/T000/B000/XXXX?x=1")
    'https://hooks.slack.com'
    >>> redact_text("POST https://user:pw@events.example:8443/v2/enqueue failed")
    'POST https://events.example:8443 failed'
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = [
    "FRAGMENT_LEN",
    "MASK",
    "RedactingFilter",
    "install_log_redaction",
    "parse_error_text",
    "redact_text",
    "redact_url",
    "register_config_secrets",
    "register_secret",
    "registered_secrets",
]

MASK = "***"
#: Secrets shorter than this are not registered for log-wide blanking (they would blank
#: ordinary words); the components that hold them never log them in the first place.
MIN_SECRET_LEN = 6

#: Runs of this many characters of a registered secret are blanked wherever they appear.
FRAGMENT_LEN = 8

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
_WORD = re.compile(r"[a-z]+")
_secrets: set[str] = set()
_fragments: set[str] = set()
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


def _secret_parts(value: str) -> list[str]:
    """The parts of ``value`` whose fragments are secret: a URL's user, password, path
    segments (not plain lower-case words such as ``services``) and query; else all of it."""
    if not _URL.fullmatch(value.strip()):
        return [value]
    try:
        parts = urlsplit(value.strip())
        user, password = parts.username, parts.password
    except ValueError:
        return [value]
    out = [p for p in (user, password, parts.query, parts.fragment) if p]
    out += [seg for seg in parts.path.split("/") if seg and not _WORD.fullmatch(seg)]
    return out


def fragments_of(value: str) -> set[str]:
    """Every run of :data:`FRAGMENT_LEN` characters of the secret parts of ``value``."""
    n = FRAGMENT_LEN
    return {part[i : i + n] for part in _secret_parts(value) for i in range(len(part) - n + 1)}


def register_secret(value: str | None) -> None:
    """Blank ``value``, and any run of :data:`FRAGMENT_LEN` characters of it, in every log line
    from now on (see :class:`RedactingFilter`)."""
    if value and len(value) >= MIN_SECRET_LEN:
        frags = fragments_of(value)
        with _lock:
            _secrets.add(value)
            _fragments.update(frags)


_SECRET_KEY = re.compile(
    r"""(?im)["']?[\w-]*(?:key|token|secret|passw(?:or)?d|authorization|url|webhook)[\w-]*"""
    r"""["']?[ \t]*:[ \t]*(?:"([^"\n]*)"?|'([^'\n]*)'?|([^\s,}\]#"'][^,}\]#\n]*))"""
)


def register_config_secrets(text: str) -> None:
    """Register the values of a config file's secret-looking keys (``routing_key``, ``url``,
    ``token``, ``password``, ``Authorization``, ...) found in its raw text, so that what a
    parser quotes from a file that does not load is blanked too."""
    for m in _SECRET_KEY.finditer(text):
        value = next((g for g in m.groups() if g is not None), "").strip()
        register_secret(value)


def parse_error_text(exc: BaseException) -> str:
    """What a YAML or JSON parser said about a config file, without the text it quotes: the
    problem (and its context) at line and column; redacted (:func:`redact_text`)."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is not None or mark is not None:  # PyYAML's MarkedYAMLError
        context = getattr(exc, "context", None)
        text = "; ".join(p for p in (context, problem) if p) or type(exc).__name__
        if mark is not None:
            text += f" (line {mark.line + 1}, column {mark.column + 1})"
    elif isinstance(exc, json.JSONDecodeError):
        text = f"{exc.msg} (line {exc.lineno}, column {exc.colno})"
    elif isinstance(exc, OSError | UnicodeDecodeError):
        text = f"{type(exc).__name__}: {exc}"
    else:  # another parser's error: its type only, its text may quote the file
        text = f"{type(exc).__name__} (the file does not parse)"
    return redact_text(text)


def registered_secrets() -> list[str]:
    with _lock:
        return sorted(_secrets, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every URL cut by :func:`redact_url`, every secret value (those given and
    the registered ones) and every run of :data:`FRAGMENT_LEN` characters of one replaced by
    ``***``."""
    out = _URL.sub(lambda m: redact_url(m.group(0)), text)
    given = {s for s in secrets if s}
    values = given | set(registered_secrets())
    for s in sorted(values, key=len, reverse=True):
        out = out.replace(s, MASK)
    with _lock:
        frags = set(_fragments) if _fragments else _fragments
    if given:
        frags = frags | set().union(*(fragments_of(s) for s in given if len(s) >= MIN_SECRET_LEN))
    return _blank_fragments(out, frags) if frags else out


def _blank_fragments(text: str, frags: set[str]) -> str:
    """``text`` with every stretch covered by runs in ``frags`` replaced by one ``***``."""
    n = FRAGMENT_LEN
    hits = [i for i in range(len(text) - n + 1) if text[i : i + n] in frags]
    if not hits:
        return text
    out: list[str] = []
    pos = 0
    start = end = hits[0]
    for i in hits:
        if i > end:  # a gap: close the stretch
            out.append(text[pos:start] + MASK)
            pos, start = end, i
        end = i + n
    out.append(text[pos:start] + MASK + text[end:])
    return "".join(out)


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
