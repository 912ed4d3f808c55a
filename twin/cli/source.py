"""Where a read command (`status`, `headroom`, `hotspots`, `fleets`, `forecast`) reads: a
running service's HTTP API or a store file.

``dctwin serve`` holds its DuckDB file's lock (DuckDB allows one process per file), so a live
site is read through its API: ``--api URL``, or ``DCTWIN_API_URL`` when set (``dctwin demo``
writes it to its ``demo.env``). ``--db PATH`` reads a store file no service holds (a copy, a
replay, a stopped service's). Which one, in order: ``--api``; ``--db``; ``DCTWIN_API_URL``;
the file ``dctwin.duckdb``. Both give the same answer in the same rows and columns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer

from twin.cli.common import fail

ApiOpt = Annotated[
    str | None,
    typer.Option(
        "--api",
        help="Read from a running service's API at this URL (e.g. http://127.0.0.1:8420);"
        " default: DCTWIN_API_URL when set and --db is not given.",
        show_default=False,
    ),
]

ReadDbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db",
        help="Read this DuckDB store file instead (default: dctwin.duckdb when neither --api nor"
        " DCTWIN_API_URL is given). A running service holds its file: use --api for it.",
        show_default=False,
    ),
]

#: The store file a read command opens when nothing else is said.
DEFAULT_DB = Path("dctwin.duckdb")

#: Seconds the CLI waits for the API's answer (a forecast or a hot-spot search is computed on
#: request and takes a few seconds on a large site).
API_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Source:
    """One of: ``api`` (a base URL) or ``db`` (a store file)."""

    api: str | None = None
    db: Path | None = None

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """``GET`` of ``path`` on the API, its JSON; every failure a clear message and exit 2."""
        assert self.api is not None
        return api_get(self.api, path, params)

    def where(self) -> str:
        return f"the API at {self.api}" if self.api else f"--db {self.db}"


def pick_source(api: str | None, db: Path | None) -> Source:
    """The source by the order of the module docstring."""
    if api and db is not None:
        raise fail("give --api URL or --db PATH, not both")
    if api:
        return Source(api=_check_url(api, "--api"))
    if db is not None:
        return Source(db=db)
    env = os.environ.get("DCTWIN_API_URL", "").strip()
    if env:
        return Source(api=_check_url(env, "DCTWIN_API_URL"))
    return Source(db=DEFAULT_DB)


def _check_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise fail(f"{where} {url!r} is not an http(s) URL, e.g. http://127.0.0.1:8420")
    return url.rstrip("/")


def api_get(base: str, path: str, params: dict[str, Any] | None = None) -> Any:
    """The JSON answer of ``GET base+path``; a refused connection, a timeout or an error status
    ends in a message saying which (exit 2), never a traceback."""
    import httpx

    url = base + path
    query = {k: v for k, v in (params or {}).items() if v is not None}
    try:
        r = httpx.get(url, params=query, timeout=API_TIMEOUT_S)
    except httpx.TimeoutException:
        raise fail(f"{url}: no answer within {API_TIMEOUT_S:g} s") from None
    except httpx.HTTPError as e:
        raise fail(
            f"cannot reach the dctwin API at {base} ({type(e).__name__}: {e}): is `dctwin serve`"
            " running there? (a store file no service holds: --db PATH)"
        ) from None
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = None
        if not isinstance(detail, str):
            detail = r.text[:300].strip() or r.reason_phrase
        again = f" (retry in {r.headers['Retry-After']} s)" if "Retry-After" in r.headers else ""
        raise fail(f"{url}: {r.status_code} {detail}{again}")
    try:
        return r.json()
    except ValueError:
        raise fail(f"{url}: the answer is not JSON (is this a dctwin API?)") from None


def open_read_store(db: Path):
    """The store file read-only; a missing file or one a service holds is a message that says
    what to do (exit 2)."""
    from twin.store import Store, StoreError

    if not db.exists():
        raise fail(
            f"--db {db}: no such store (run `dctwin serve` or `dctwin ingest` first; a running"
            " service is read with --api URL or DCTWIN_API_URL)"
        )
    try:
        return Store(db, read_only=True)
    except StoreError as e:
        if "open by another process" in str(e):
            raise fail(
                f"--db {db} is held by a running service (DuckDB allows one process per file):"
                " read it through the service's API with --api URL (e.g. --api"
                " http://127.0.0.1:8420) or DCTWIN_API_URL (`dctwin demo` writes it to demo.env)"
            ) from None
        raise fail(str(e)) from None


__all__ = [
    "DEFAULT_DB",
    "ApiOpt",
    "ReadDbOpt",
    "Source",
    "api_get",
    "open_read_store",
    "pick_source",
]
