"""The shards of a site view and the concurrent calls to their APIs.

A :class:`Shard` remembers when it last answered; :class:`Fanout` asks every shard at once
(``httpx.AsyncClient``, ``timeout_s`` per shard) and returns one :class:`Answer` per shard,
never raising for a shard that is down, slow or failing: that shard's answer carries the
reason and the shard turns ``stale`` until it answers again.

With ``answer_within_s``, a read of the API (GET ``/api/...``) does not wait ``timeout_s``
for a shard that is slow but has answered the same question before: past ``answer_within_s``
it is answered from that shard's last good answer, marked with when it was received
(``Answer.cached_at``; the site view reports the shard stale with that age), while the call
to the shard goes on in the background and refreshes the answer for the next caller. One
call per shard and question is in flight at a time: callers meanwhile share it, so a slow
shard is not asked again and again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from twin.redact import parse_error_text

#: Last good answers kept for ``answer_within_s``, over all shards and reads: the oldest goes
#: first (a series read names its own time window, so each is a key of its own). [1]
MAX_KEPT_ANSWERS = 256
#: A shard name: a slug, as the site file's ``shards[].name`` (/work/briefs/shards-spec.md).
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.:-]*$")


class ShardsError(ValueError):
    """The shards given to the site view are not usable; the message says which and why."""


@dataclass
class Shard:
    """One shard's API and what the site view knows of it."""

    name: str
    url: str
    last_ok_at: datetime | None = None
    last_error: str | None = None
    last_tried_at: datetime | None = None

    def stale(self) -> bool:
        """True unless its latest call was answered."""
        return self.last_tried_at is None or self.last_error is not None

    def report(self, now: datetime | None = None) -> dict[str, Any]:
        """The ``shards`` entry: status, age [s] since the last good answer (None: never)."""
        now = now or datetime.now(UTC)
        age = None if self.last_ok_at is None else (now - self.last_ok_at).total_seconds()
        return {
            "name": self.name,
            "url": self.url,
            "status": "stale" if self.stale() else "ok",
            "age_s": None if age is None else round(max(age, 0.0), 3),
            "last_ok_at": self.last_ok_at,
            "error": self.last_error,
        }


@dataclass
class Answer:
    """One shard's answer to one call: ``status`` None when it did not answer at all."""

    shard: Shard
    status: int | None
    body: Any = None
    content_type: str = ""
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: when the shard gave this answer, where it is a last good answer served because the
    #: shard did not answer within the fan-out's ``answer_within_s`` (None: answered now)
    cached_at: datetime | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def json(self) -> Any:
        return self.body


def _check_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ShardsError(f"{where}: {url!r} is not an http(s) URL, e.g. http://127.0.0.1:8421")
    return url.rstrip("/")


def parse_shards(text: str) -> list[Shard]:
    """``--shards``: comma-separated ``URL`` or ``NAME=URL``; a shard without a name is named
    by its host:port."""
    shards: list[Shard] = []
    for i, item in enumerate(p.strip() for p in text.split(",")):
        if not item:
            continue
        name, sep, url = item.partition("=")
        if not sep:
            name, url = "", item
        url = _check_url(url.strip(), f"--shards item {i + 1}")
        name = name.strip() or (urlsplit(url).netloc)
        if not NAME_RE.match(name):
            raise ShardsError(f"--shards item {i + 1}: shard name {name!r} is not a slug")
        shards.append(Shard(name=name, url=url))
    return _unique(shards, "--shards")


def shards_from_site_file(path: Path) -> list[Shard]:
    """The shards of a site file, from its ``shards:`` list (``name`` and ``api_url``), read
    from the raw YAML: the site view needs only their addresses."""
    try:
        # libyaml's loader where PyYAML has it: a 100,000-GPU site file is 4.3 MB
        raw = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as e:
        raise ShardsError(f"--site {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ShardsError(f"--site {path}: not YAML ({parse_error_text(e)})") from None
    items = raw.get("shards") if isinstance(raw, dict) else None
    if not items:
        raise ShardsError(f"--site {path}: no shards: list; name the shards' APIs with --shards")
    if not isinstance(items, list):
        raise ShardsError(f"--site {path}: shards: expected a list")
    shards: list[Shard] = []
    for i, item in enumerate(items):
        where = f"--site {path}: shards[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ShardsError(f"{where}: expected a mapping with a name")
        url = item.get("api_url")
        if not isinstance(url, str) or not url:
            raise ShardsError(f"{where} ({item['name']}): no api_url; add one or use --shards")
        shards.append(Shard(name=item["name"], url=_check_url(url, f"{where}.api_url")))
    return _unique(shards, f"--site {path}")


def _unique(shards: list[Shard], where: str) -> list[Shard]:
    if not shards:
        raise ShardsError(f"{where}: no shard given")
    seen: set[str] = set()
    for s in shards:
        if s.name in seen:
            raise ShardsError(f"{where}: shard {s.name!r} given twice")
        seen.add(s.name)
    return shards


class Fanout:
    """Concurrent calls to every shard's API, each bounded by ``timeout_s``."""

    def __init__(
        self, shards: list[Shard], timeout_s: float = 5.0, answer_within_s: float | None = None
    ):
        self.shards = shards
        self.timeout_s = timeout_s
        self.answer_within_s = answer_within_s
        self._client: httpx.AsyncClient | None = None
        #: (shard, path, params) -> the last 2xx answer to that read and when it came
        self._good: OrderedDict[tuple[str, str, str], tuple[datetime, Answer]] = OrderedDict()
        #: the reads in flight, shared by the callers that ask the same meanwhile
        self._inflight: dict[tuple[str, str, str], asyncio.Task[Answer]] = {}

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        return self._client

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def call(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> list[Answer]:
        """One answer per shard, in the shards' order."""
        if method != "GET" or self.answer_within_s is None or not path.startswith("/api/"):
            # writes, /healthz and /metrics: always the shard's answer now
            return list(
                await asyncio.gather(
                    *(self._one(s, method, path, params, json, headers) for s in self.shards)
                )
            )
        keys = [(s.name, path, repr(sorted((params or {}).items()))) for s in self.shards]
        tasks = [
            self._read(s, k, path, params, headers) for s, k in zip(self.shards, keys, strict=True)
        ]
        await asyncio.wait(tasks, timeout=self.answer_within_s)
        out: list[Answer] = []
        for key, task in zip(keys, tasks, strict=True):
            last = self._good.get(key)
            if task.done() or last is None:
                out.append(await task)  # at most timeout_s: httpx's own timeout ends it
            else:  # slow, answered before: its last answer now, the call refreshes it
                at, answer = last
                out.append(dataclasses.replace(answer, cached_at=at))
        return out

    def _read(
        self,
        shard: Shard,
        key: tuple[str, str, str],
        path: str,
        params: dict[str, Any] | None,
        headers: dict[str, str] | None,
    ) -> asyncio.Task[Answer]:
        """The read of ``key`` in flight, started if none is; a 2xx answer is kept."""
        task = self._inflight.get(key)
        if task is not None:
            return task

        async def read() -> Answer:
            try:
                answer = await self._one(shard, "GET", path, params, None, headers)
                if answer.ok:
                    self._good[key] = (datetime.now(UTC), answer)
                    self._good.move_to_end(key)
                    while len(self._good) > MAX_KEPT_ANSWERS:
                        self._good.popitem(last=False)
                return answer
            finally:
                self._inflight.pop(key, None)

        task = asyncio.ensure_future(read())
        self._inflight[key] = task
        return task

    async def _one(
        self,
        shard: Shard,
        method: str,
        path: str,
        params: dict[str, Any] | None,
        body: Any,
        headers: dict[str, str] | None,
    ) -> Answer:
        now = datetime.now(UTC)
        shard.last_tried_at = now
        try:
            r = await self.client().request(
                method, shard.url + path, params=params, json=body, headers=headers
            )
        except httpx.TimeoutException:
            shard.last_error = f"no answer within {self.timeout_s:g} s"
            return Answer(shard, None, error=shard.last_error)
        except httpx.HTTPError as e:
            shard.last_error = f"cannot reach {shard.url} ({type(e).__name__}: {e})"
            return Answer(shard, None, error=shard.last_error)
        ctype = r.headers.get("content-type", "")
        data: Any = r.content
        if ctype.startswith("application/json"):
            try:
                data = r.json()
            except ValueError:
                shard.last_error = f"HTTP {r.status_code}: not JSON"
                return Answer(shard, None, error=shard.last_error)
        # a 503 from /healthz (ingest stalled) is an answer; other 5xx are failures
        answered = r.status_code < 500 or (
            r.status_code == 503 and isinstance(data, dict) and data.get("status") == "stalled"
        )
        if answered:
            shard.last_ok_at = datetime.now(UTC)
            shard.last_error = None
        else:
            detail = data.get("detail") if isinstance(data, dict) else r.text[:200]
            shard.last_error = f"HTTP {r.status_code}: {detail}"
        return Answer(shard, r.status_code, data, ctype, None if answered else shard.last_error)

    def report(self, now: datetime | None = None) -> list[dict[str, Any]]:
        now = now or datetime.now(UTC)
        return [s.report(now) for s in self.shards]
