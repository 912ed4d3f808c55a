"""The site view: one HTTP API for a site served by several shards (`dctwin site-view`).

Each shard is a `dctwin serve` with its own store and its own API. The site view asks every
shard's API concurrently (one ``httpx.AsyncClient``, a timeout per shard) and merges the
answers into the answer one service would give for the whole site, so that the console
(``dctwin console --api URL``) and Prometheus work against it unchanged. A shard that does not
answer is reported, never turned into an error page: every JSON answer carries a ``shards``
section (each shard's status, ``ok`` or ``stale``, and its age: the seconds since its last good
answer). :mod:`twin.siteview.merge` holds the merge rules (pure functions),
:mod:`twin.siteview.fanout` the concurrent calls and the shards' state,
:mod:`twin.siteview.app` the FastAPI application.
"""

from __future__ import annotations

from twin.siteview.app import create_siteview_app
from twin.siteview.fanout import Shard, parse_shards, shards_from_site_file

__all__ = ["Shard", "create_siteview_app", "parse_shards", "shards_from_site_file"]
