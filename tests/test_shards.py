"""Shards (issue 17): the site file's ``shards:``, ``dctwin serve --shard`` against one real broker,
and a shard killed with SIGKILL mid-stream and restarted on its store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from typer.testing import CliRunner

from collectors.contract import KINDS
from collectors.mqtt import connect, wait_until
from twin.broker import LocalBroker
from twin.cli import app
from twin.service import Service, ServiceConfig
from twin.simulator import SiteSimulator
from twin.site import SiteError, load_site
from twin.site.shards import shard_names, shard_view
from twin.store import Store

from .helpers import SMALL_SITE, broker_config

THREE_HALLS = Path(__file__).parent / "fixtures" / "sites" / "three_halls.yaml"

#: The same three halls on two shards: hall-a and hall-b together, hall-c alone.
TWO_SHARDS = [
    {"name": "ab", "halls": ["hall-a", "hall-b"], "owns": ["spine-1", "loop-ac", "lnk-c-s1"]},
    {"name": "c", "halls": ["hall-c"]},
]


def site_file(tmp_path: Path, shards: list[dict] | None) -> Path:
    """The three-hall fixture with ``shards`` in place of its own (None: as shipped)."""
    if shards is None:
        return THREE_HALLS
    data = yaml.safe_load(THREE_HALLS.read_text())
    data["shards"] = shards
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})


def sim_messages(site_path: Path, ticks: int, step_s: float = 10.0) -> list[tuple[str, bytes]]:
    """``ticks`` ticks of the simulator over the whole site, ending now."""
    site = load_site(site_path)
    start = datetime.now(UTC) - timedelta(seconds=step_s * ticks)
    sim = SiteSimulator(site, seed=7, start=start, rate_hz=1 / step_s)
    return [m for _ in range(ticks) for m in sim.step()]


def keys_of(items: list[tuple[str, bytes]]) -> list[tuple[str, str, int]]:
    """(kind, source, seq) of each message."""
    out = []
    for topic, payload in items:
        kind, source = topic.split("/")[3:5]
        out.append((kind, source, orjson.loads(payload)["seq"]))
    return out


# ---- the site file ------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [None, TWO_SHARDS], ids=["three", "two"])
def test_every_source_has_one_home_shard_and_the_filters_cover_what_it_reads(tmp_path, shards):
    path = site_file(tmp_path, shards)
    site = load_site(path)
    published = {(k, s) for k, s, _ in keys_of(sim_messages(path, 1))}
    views = [shard_view(site, n) for n in shard_names(site)]
    homes = [(v.name, src) for v in views for src in v.sources]
    assert sorted(src for _, src in homes) == sorted(published)  # each source once
    for v in views:
        assert not set(v.sources) & set(v.reads)
        assert {f"dctwin/v1/tri/{k}/{s}" for k, s in v.accepted} == set(v.topic_filters)
        # the sub-site holds every rack it stores and no shards of its own
        assert v.site.shards == []
        assert set(v.racks) <= {r.name for r in v.site.racks}
    # every rack in one shard; every spanning component owned once
    racks = [r for v in views for r in v.racks]
    assert sorted(racks) == sorted(r.name for r in site.racks)
    owned = [c for v in views for c in v.owns]
    assert len(owned) == len(set(owned))


def test_the_owner_of_a_spanning_cdu_reads_the_racks_it_serves():
    site = load_site(THREE_HALLS)
    a = shard_view(site, "hall-a")
    assert {"cdu-ab", "pdu-ab-b", "loop-ac"} <= set(a.owns)
    # cdu-ab serves b01 (hall-b); loop-ac brings cdu-c, which serves c01 (hall-c)
    assert {"cdu-ab", "cdu-c"} <= set(a.cdus)
    assert {("gpu", "trn-b01-n1"), ("pdu", "pdu-b01-a"), ("node", "inf-c01-n1")} <= set(a.reads)
    # ... but reports only its own: a read GPU or rack is hall-b's
    assert a.owns_entity("loop", "cdu-ab") and a.owns_entity("pdu_phase", "pdu-ab-b/L1")
    assert not a.owns_entity("gpu", "trn-b01-n1:0") and not a.owns_entity("rack", "b01")
    assert [r.name for r in a.site.racks] == ["a01", "a02", "b01", "c01"]  # modelled
    assert [r.name for r in a.own_site.racks] == ["a01", "a02"]  # shown by its API
    b = shard_view(site, "hall-b")
    assert (
        b.reads == []
        and "cdu-ab" not in b.cdus
        and b.fleets == {"train-1": ["b01"], "infer-1": ["b02"]}
    )
    assert b.owns_entity("gpu", "trn-b01-n1:3") and not b.owns_entity("cdu", "cdu-ab")
    assert a.api_url == "http://127.0.0.1:8421" and b.api_url is None


def test_a_site_without_shards_is_one_shard_main():
    site = load_site(SMALL_SITE)
    assert shard_names(site) == ["main"]
    v = shard_view(site, "main")
    assert v.reads == [] and v.owns == []
    assert sorted(v.racks) == ["r01", "r02"] and len(v.sources) == 2 * 3 + 4 + 1 + 2


@pytest.mark.parametrize(
    ("shards", "expected"),
    [
        (
            [{"name": "x", "halls": ["hall-a", "hall-b"]}, {"name": "y", "halls": ["hall-b"]}],
            [
                "shards: hall 'hall-b' row 'row-1' is in shards x, y",
                "shards: hall 'hall-c' row 'row-1' is in no shard",
            ],
        ),
        (
            [{"name": "ab", "halls": ["hall-a", "hall-b"]}, {"name": "c", "halls": ["hall-c"]}],
            [
                "cdus[0].loop: loop 'loop-ac' spans shards ab, c: name it in the owns of"
                " exactly one shard",
                "switches[0]: switch 'spine-1' spans shards ab, c",
            ],
        ),
        (
            [
                {"name": "ab", "halls": ["hall-a", "hall-b"], "owns": ["loop-ac", "lnk-c-s1"]},
                {"name": "c", "halls": ["hall-c"], "owns": ["spine-1", "loop-ac", "toaster"]},
            ],
            [
                "shards[1].owns[1]: loop 'loop-ac' is owned by shards ab, c: one only",
                "shards[1].owns[2]: shard 'c' owns 'toaster', which is no loop, CDU, PDU, switch"
                " or link of the site",
            ],
        ),
        (
            [{"name": "abc", "halls": ["hall-a", "hall-b"], "rows": ["hall-c/row-9"]}],
            ["shards[0].rows[0]: shard 'abc': no row 'hall-c/row-9'"],
        ),
    ],
    ids=["row-twice-and-none", "spanning-unowned", "owned-twice-and-unknown", "no-such-row"],
)
def test_bad_shards_fail_at_load_naming_the_component_and_the_shards(tmp_path, shards, expected):
    path = site_file(tmp_path, shards)
    with pytest.raises(SiteError) as e:
        load_site(path)
    text = str(e.value)
    for line in expected:
        assert line in text, text
    assert f"{path}:" in text  # with the file and line


def test_serve_refuses_an_unknown_shard_in_one_line(tmp_path):
    r = cli("serve", "--site", THREE_HALLS, "--shard", "hall-z", "--db", tmp_path / "z.duckdb")
    assert r.exit_code == 2
    out = r.output.strip()
    assert (
        out == "error: --shard: no shard 'hall-z' in site 'tri'; its shards: hall-a, hall-b, hall-c"
    ), out
    assert not (tmp_path / "z.duckdb").exists()
    r = cli("serve", "--shard", "hall-a", "--db", tmp_path / "z.duckdb")
    assert r.exit_code == 2 and "--shard needs --site" in r.output


@pytest.mark.slow  # three services built on a store: about 3 s
def test_a_store_remembers_its_shard_and_refuses_another(tmp_path):
    site = load_site(THREE_HALLS)
    db = tmp_path / "a.duckdb"
    Service(ServiceConfig(db=db, site=site, shard="hall-a", api=False)).stop()
    r = cli("serve", "--site", THREE_HALLS, "--shard", "hall-b", "--db", db, "--no-api")
    assert r.exit_code == 2
    assert f"{db} is the store of shard 'hall-a', not of shard 'hall-b'" in r.output
    r = cli("serve", "--site", THREE_HALLS, "--db", db, "--no-api")  # the whole site is "main"
    assert r.exit_code == 2 and "not of shard 'main'" in r.output
    r = cli("status", "--db", db, "--json")
    assert r.exit_code == 0 and json.loads(r.output)["shard"] == "hall-a"
    # its API shows its own racks, not those it reads for cdu-ab and loop-ac
    cfg = ServiceConfig(db=db, site=site, shard="hall-a", api_port=0, detect_every_s=0)
    with Service(cfg) as svc:
        racks = httpx.get(f"{svc.url}/api/v1/racks", timeout=30).json()
        status = httpx.get(f"{svc.url}/api/v1/status", timeout=30).json()
    assert sorted(r["name"] for r in racks["racks"]) == ["a01", "a02"]
    assert status["shard"] == "hall-a"


def test_serve_help_names_the_shard_option():
    r = cli("serve", "--help")
    assert r.exit_code == 0
    text = " ".join(r.output.replace("│", " ").split())
    assert "--shard <str> Run as this shard of the site file's shards:" in text, text
    assert "dctwin-ingest-SHARD with --shard" in text


# ---- against one broker ---------------------------------------------------------------------


def publish_all(b: LocalBroker, items: list[tuple[str, bytes]], rate_hz: float = 0.0) -> None:
    client = connect(broker_config(b), f"pub-{os.getpid()}-{time.monotonic_ns()}")
    infos = []
    for topic, payload in items:
        infos.append(client.publish(topic, payload, qos=1))
        if rate_hz:
            time.sleep(1 / rate_hz)
    for info in infos:
        info.wait_for_publish(30)
    client.disconnect()
    client.loop_stop()


class Shard:
    """One `dctwin serve` process (a shard, or the whole site with ``shard`` None)."""

    def __init__(self, b: LocalBroker, site: Path, db: Path, shard: str | None, **opts: str):
        self.b, self.site, self.db, self.shard = b, site, db, shard
        self.log = db.with_suffix(".log")
        self.opts = opts
        self.proc: subprocess.Popen | None = None
        self._start_at = 0

    def start(self) -> Shard:
        args = [sys.executable, "-m", "twin.cli", "serve", "--broker", self.b.address]
        args += ["--site", str(self.site), "--db", str(self.db), "--no-api"]
        args += ["--flush-interval", "0.1", "--detect-every", "0", "--calibrate-every", "0"]
        if self.shard is not None:
            args += ["--shard", self.shard]
        for k, v in self.opts.items():
            args += [f"--{k.replace('_', '-')}", v]
        self._start_at = self.log.stat().st_size if self.log.exists() else 0
        env = {**os.environ, **self.b.client_env()}
        self.proc = subprocess.Popen(
            args, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env
        )
        return self

    def wait_serving(self) -> None:
        assert self.proc is not None
        assert wait_until(
            lambda: (
                b"serving:" in self.log.read_bytes()[self._start_at :]
                or self.proc.poll() is not None
            ),
            60,
        )
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(how)
            self.proc.wait(60)

    def counters(self) -> dict:
        """The counters the last clean stop printed."""
        lines = [ln for ln in self.log.read_text().splitlines() if ln.startswith('{"received"')]
        return json.loads(lines[-1])

    def logged(self) -> list[tuple[str, str, int]]:
        with Store(self.db, read_only=True) as s:
            return s.con.execute("SELECT kind, source, seq FROM ingest_log").fetchall()

    def until_stored(self, n: int, timeout_s: float = 90.0) -> list[tuple[str, str, int]]:
        """Stop cleanly once the store holds ``n`` messages (restarting it meanwhile: the
        store is the running service's alone); the messages logged."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.stop()
            logged = self.logged()
            if len(logged) >= n or time.monotonic() > deadline:
                return logged
            self.start().wait_serving()
            time.sleep(2.0)


def _check_each_stored_once(views, shards, published) -> None:
    by_home = {src: v.name for v in views for src in v.sources}
    for v in views:
        want = sorted(k for k in published if k[:2] in v.accepted)
        got = shards[v.name].until_stored(len(want))
        assert sorted(got) == want, v.name  # each of its messages once, nothing else
        assert all(by_home[k[:2]] == v.name or k[:2] in v.reads for k in got)


@pytest.mark.slow  # several serve processes and a broker: tens of seconds
@pytest.mark.parametrize("shards", [TWO_SHARDS, None], ids=["two", "three"])
def test_shards_on_one_broker_store_each_sample_once_in_its_own_shard(broker, tmp_path, shards):
    if broker.kind == "embedded":
        pytest.skip("the no-loss guarantees hold on Mosquitto (DESIGN.md)")
    path = site_file(tmp_path, shards)
    site = load_site(path)
    views = [shard_view(site, n) for n in shard_names(site)]
    last = views[-1].name
    # the last shard's persistent session still holds an old '#' subscription (a session
    # reused from an unsharded service): what arrives for other shards must not be stored
    old = connect(
        broker_config(broker),
        f"dctwin-ingest-{last}",
        persistent=True,
        subscriptions=["dctwin/v1/#"],
    )
    old.disconnect()
    old.loop_stop()
    procs = {v.name: Shard(broker, path, tmp_path / f"{v.name}.duckdb", v.name) for v in views}
    whole = Shard(broker, path, tmp_path / "whole.duckdb", None, client_id="whole")
    for p in [*procs.values(), whole]:
        p.start()
    try:
        for p in [*procs.values(), whole]:
            p.wait_serving()
        items = sim_messages(path, ticks=40)
        publish_all(broker, items)
        published = keys_of(items)
        assert len(set(published)) == len(published)
        _check_each_stored_once(views, procs, published)
        assert sorted(whole.until_stored(len(published))) == sorted(published)
        foreign = procs[last].counters()["foreign"]
        others = sum(1 for k in published if k[:2] not in views[-1].accepted)
        assert foreign >= others > 0  # every message of other shards counted, none stored
        assert procs[last].counters()["dead_letters"] == {}
        assert {k for k in KINDS if any(x[0] == k for x in published)} == set(KINDS)
    finally:
        for p in [*procs.values(), whole]:
            p.stop(signal.SIGKILL)
    # the spanning CDUs' headroom in their owner equals the single process's on the same data
    owner = next(v for v in views if "cdu-ab" in v.cdus)
    mine = cli("headroom", "--db", procs[owner.name].db, "--site", path, "--shard", owner.name)
    single = cli("headroom", "--db", whole.db, "--site", path, "--json")
    assert single.exit_code == 0, single.output
    ref = json.loads(single.output)["rows"]
    r = cli(
        "headroom", "--db", procs[owner.name].db, "--site", path, "--shard", owner.name, "--json"
    )
    assert r.exit_code == 0 and mine.exit_code == 0, r.output
    rows = json.loads(r.output)["rows"]

    def spans(x: dict) -> bool:  # the spanning CDUs' rows, and the spanning PDU's phases
        return (x["kind"] in ("cdu", "loop") and x["id"] in ("cdu-ab", "cdu-c")) or (
            x["kind"] == "pdu_phase" and x["id"].startswith("pdu-ab-b/")
        )

    spanning = [x for x in rows if spans(x)]
    assert len([x for x in spanning if x["kind"] != "pdu_phase"]) == 6  # heat, flow, return
    assert len(spanning) > 6
    assert all(x["value_now"] is not None and x["headroom_now"] is not None for x in spanning)
    assert spanning == [x for x in ref if spans(x)]
    assert all(owner.owns_entity(x["kind"], x["id"]) for x in rows)


@pytest.mark.slow  # a shard killed and restarted mid-stream: tens of seconds
def test_a_shard_killed_mid_stream_and_restarted_loses_and_doubles_nothing(broker, tmp_path):
    if broker.kind == "embedded":
        pytest.skip("amqtt does not redeliver QoS 1 messages in flight to a client that crashed")
    site = load_site(THREE_HALLS)
    view = shard_view(site, "hall-b")
    shard = Shard(broker, THREE_HALLS, tmp_path / "hall-b.duckdb", "hall-b").start()
    try:
        shard.wait_serving()
        items = sim_messages(THREE_HALLS, ticks=60)
        mine = [k for k in keys_of(items) if k[:2] in view.accepted]
        publisher = threading.Thread(target=publish_all, args=(broker, items, 300.0))
        publisher.start()
        time.sleep(1.0)  # mid-stream
        shard.stop(signal.SIGKILL)  # a crash: no flush, no acks
        before = len(shard.logged())
        assert 0 < before < len(mine)  # killed mid-stream
        time.sleep(0.5)  # the broker keeps what arrives meanwhile for the persistent session
        shard.start().wait_serving()  # same store, same (derived) client id
        publisher.join(120)
        assert not publisher.is_alive()
        got = shard.until_stored(len(mine))
        assert sorted(got) == sorted(mine)  # nothing lost, nothing twice
        with Store(shard.db, read_only=True) as s:
            gpus = s.con.execute("SELECT count(*), count(DISTINCT (id, ts)) FROM gpu").fetchone()
        assert gpus[0] == gpus[1] == 8 * 2 * 60  # two 8-GPU nodes, 60 ticks
    finally:
        shard.stop(signal.SIGKILL)


def test_one_hall_split_by_rows(tmp_path):
    data = yaml.safe_load(THREE_HALLS.read_text())
    hall_a = data["halls"][0]
    a02 = hall_a["rows"][0]["racks"].pop()
    hall_a["rows"].append({"name": "row-2", "racks": [a02]})
    data["shards"] = [
        {"name": "x", "rows": ["hall-a/row-1"], "owns": ["loop-ac", "lnk-a-s1"]},
        {"name": "y", "rows": ["hall-a/row-2"], "halls": ["hall-b", "hall-c"], "owns": ["spine-1"]},
    ]
    path = tmp_path / "rows.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    site = load_site(path)
    x, y = shard_view(site, "x"), shard_view(site, "y")
    assert x.rows == ["hall-a/row-1"] and x.racks == ["a01"] and x.halls == ["hall-a"]
    assert y.rows == ["hall-a/row-2", "hall-b/row-1", "hall-c/row-1"]
    assert [w.name for h in y.site.halls for w in h.rows] == ["row-2", "row-1", "row-1"]
    assert "cdu-ab" in y.cdus and "cdu-c" in x.cdus  # loop-ac's owner has both its CDUs
    assert ("gpu", "inf-c01-n1") in x.reads and ("pdu", "pdu-ab-b") in y.sources


@pytest.mark.slow  # a store and a simulated site: just over 1 s under load
def test_the_ingest_of_a_shard_counts_other_shards_messages_and_stores_none():
    from twin.ingest import Ingester

    site = load_site(THREE_HALLS)
    view = shard_view(site, "hall-c")
    items = sim_messages(THREE_HALLS, ticks=3)
    bad = ("dctwin/v1/tri/gpu", b"{}")  # not a contract topic: dead-lettered, not foreign
    with Store(":memory:") as store:
        ing = Ingester(store, site, accept=view.accepted)
        ing.ingest([*items, bad])
        logged = store.con.execute("SELECT kind, source, seq FROM ingest_log").fetchall()
    mine = [k for k in keys_of(items) if k[:2] in view.accepted]
    assert sorted(logged) == sorted(mine) and mine
    assert ing.counters.foreign == len(items) - len(mine) > 0
    assert dict(ing.counters.dead_letters) == {"bad_topic": 1}
