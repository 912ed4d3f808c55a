"""The alert engine: observations in, grouped, inhibited, silenced notifications out.

One evaluation (:meth:`AlertEngine.evaluate`) does, in order:

1. **Per entity and rule** (observations in time order), one state machine::

       inactive --breached--> pending --held for_s--> firing --past clear_value--> inactive
                                 \\--not breached--> inactive

   ``for_s`` is measured on observation timestamps (``ts``), so replayed telemetry behaves as
   live telemetry does. A firing alert stays firing while its value is on the alert side of
   ``clear_value`` (hysteresis). With ``resolve_if_absent_s``, an entity that reports nothing
   for that long is cleared (event-like detectors report only while the event holds).
   With ``keep_firing_for_s``, a firing alert whose value goes past ``clear_value`` (or absent)
   stays firing that long; an observation back on the alert side of ``clear_value`` within it
   continues the same alert, and the first observation past it clears it. A kept alert
   holds an incident already paged open; it never starts a page (one muted until its
   condition cleared is not paged when the mute ends).
2. **Groups**: firing alerts of one rule under the same ``group_by`` ancestor (from
   :class:`~twin.alerts.topology.Topology`) are one incident with one dedup key,
   ``dctwin/<site>/<rule>/<group kind>/<group id>`` (over 255 characters: a readable head and
   a hash of the whole, see :func:`dedup_key`). An incident is paged once (after
   ``group_wait_s``, so members that fire together are listed together) and resolved once,
   when its last member clears; members that join later are added to the resolve, not paged.
   With ``repeat_interval_s``, a paged incident still firing (with an unmuted member, not
   acknowledged, not flapping) is re-sent every interval: same dedup key and ``starts_at``,
   ``repeat`` 1, 2, ... and an ``event_id`` of its own, so the outbox sends it as a new event.
   **Flap detection** (``flap_changes``): per incident key, each time the incident fires (a
   first member's condition holds) or clears (the last one's stops holding, keep_firing_for
   or not) is one change; ``flap_changes`` of them within ``flap_window_s`` mark it flapping:
   no reminders, and its members stay firing until clear ``flap_stable_s``, so it resolves
   once (``flapping: true``) and its count starts again. The counts outlive a resolve, so
   incidents that resolve and re-fire add up too (those before the mark were paged as usual).
3. **Inhibition**: while rule A fires for entity X, alerts of each rule in A's ``inhibits`` on
   X or on entities below X (along ``cooling`` or ``power``) are muted, and stay muted
   ``hold_s`` after A clears. **Silences** mute by matchers until they expire. A muted alert
   is not paged, as in Alertmanager; it still has its state, so if it still fires once the
   mute ends it is paged then, on a value observed since the mute ended (not on the one it
   was muted with: a drift measured during a fault and unmeasurable since is not news when
   the fault's page resolves). An incident already paged is still resolved when it clears,
   even if muted meanwhile: an open page that never resolves is worse than one resolve more.
4. **Persist and enqueue**: the engine's state (pending and firing alerts with their
   keep-firing clocks, incidents with their reminder counts, flap counts, holds)
   and the notifications go to the store in one transaction, so a restart neither re-pages a
   firing incident nor forgets to resolve it, and no notification is lost or doubled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from collectors.contract import split_sub_id
from twin.alerts.db import AlertDb
from twin.alerts.metrics import METRICS
from twin.alerts.model import (
    GroupRef,
    Member,
    Notification,
    Observation,
    Silence,
    event_id,
    utc_iso,
)
from twin.alerts.rules import Rule, RuleSet, load_rules, render_summary
from twin.alerts.topology import Entity, Topology, kind_word
from twin.store import alerts as store_alerts

if TYPE_CHECKING:
    from twin.alerts.outbox import Outbox

__all__ = ["AlertEngine", "Silences", "dedup_key"]

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]
_SEP = "\x1f"


def _now() -> datetime:
    return datetime.now(UTC)


#: PagerDuty Events API v2: ``dedup_key`` is at most 255 characters.
DEDUP_KEY_MAX = 255
_DEDUP_HASH_HEX = 16  # 64 bits of sha256: a collision among a site's incidents is negligible


def dedup_key(site: str, rule: str, group: Entity) -> str:
    """``dctwin/<site>/<rule>/<group kind>/<group id>``: the same incident, the same key.

    A key over :data:`DEDUP_KEY_MAX` characters keeps its first 238 characters as a readable
    head and ends in ``~`` and 16 hex digits of the sha256 of the whole key: never a plain cut,
    so two long keys that differ only past the head still differ.
    """
    key = f"dctwin/{site}/{rule}/{group[0]}/{group[1]}"
    if len(key) <= DEDUP_KEY_MAX:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:_DEDUP_HASH_HEX]
    return f"{key[: DEDUP_KEY_MAX - _DEDUP_HASH_HEX - 1]}~{digest}"


def _dt(s: str | None) -> datetime | None:
    return datetime.fromisoformat(s) if s is not None else None


# ---- state ---------------------------------------------------------------------------------


_INSTANCE_TIMES = ("since", "last_ts", "fired_at", "clearing_since", "released_at")


@dataclass
class _Instance:
    """One rule on one entity, pending or firing."""

    rule: str
    entity_kind: str
    entity_id: str
    state: str  # "pending" | "firing"
    since: datetime
    value: float
    last_ts: datetime
    fired_at: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    clearing_since: datetime | None = None  # firing, past clear_value: keep_firing_for runs
    muted: bool = False  # inhibited or silenced at the last evaluation
    released_at: datetime | None = None  # when it was last unmuted: a page needs a value since

    @property
    def key(self) -> str:
        return _SEP.join(("i", self.rule, self.entity_kind, self.entity_id))

    def to_json(self) -> str:
        d = asdict(self)
        for k in _INSTANCE_TIMES:
            d[k] = d[k].isoformat() if d[k] is not None else None
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> _Instance:
        d = json.loads(s)
        for k in _INSTANCE_TIMES:
            d.setdefault(k, None)
            d[k] = _dt(d[k])
        return cls(**d)


@dataclass
class _Group:
    """One incident: a rule's firing alerts under one ancestor."""

    rule: str
    kind: str
    id: str
    dedup_key: str
    severity: str
    first_fired_at: datetime
    notified: bool = False
    starts_at: datetime | None = None
    summary: str = ""
    description: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> Member json
    cleared_at: datetime | None = None
    sent_at: datetime | None = None  # the last page or reminder (repeat_interval_s)
    repeat: int = 0  # reminders sent
    acknowledged: bool = False  # no more reminders
    #: a recurrence kept, not sent (recur_as_ticket_s): no reminder and no resolve either
    quiet: bool = False

    @property
    def key(self) -> str:
        return _SEP.join(("g", self.rule, self.kind, self.id))

    def to_json(self) -> str:
        d = asdict(self)
        for k in ("first_fired_at", "starts_at", "cleared_at", "sent_at"):
            d[k] = d[k].isoformat() if d[k] is not None else None
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> _Group:
        d = json.loads(s)
        for k in ("first_fired_at", "starts_at", "cleared_at", "sent_at"):
            d.setdefault(k, None)
            d[k] = _dt(d[k])
        return cls(**d)


@dataclass
class _Hold:
    """An inhibiting alert that cleared, still muting until ``until``."""

    rule: str
    entity_kind: str
    entity_id: str
    until: datetime

    @property
    def key(self) -> str:
        return _SEP.join(("h", self.rule, self.entity_kind, self.entity_id))

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "until": self.until.isoformat()})

    @classmethod
    def from_json(cls, s: str) -> _Hold:
        d = json.loads(s)
        d["until"] = datetime.fromisoformat(d["until"])
        return cls(**d)


@dataclass
class _Flap:
    """Flap detection for one incident key (rule and group): its state changes in the window.

    ``hot`` holds the members whose condition holds (firing, not clearing): the incident fires
    when it becomes non-empty and clears when it becomes empty; each is one change. Outlives
    the incident it counts for, so changes across a resolve and a re-fire add up.
    """

    rule: str
    kind: str
    id: str
    hot: list[str] = field(default_factory=list)
    changes: list[datetime] = field(default_factory=list)
    flapping: bool = False

    @property
    def key(self) -> str:
        return _SEP.join(("f", self.rule, self.kind, self.id))

    def to_json(self) -> str:
        d = asdict(self)
        d["changes"] = [t.isoformat() for t in self.changes]
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> _Flap:
        d = json.loads(s)
        d["changes"] = [datetime.fromisoformat(t) for t in d["changes"]]
        return cls(**d)


@dataclass
class _Recent:
    """The last page and ticket of a rule on a group, for ``recur_as_ticket_s``."""

    rule: str
    kind: str
    id: str
    paged_at: datetime
    ticket_at: datetime | None = None
    last_at: datetime | None = None  # the latest incident (paged, ticketed or kept quiet)

    @property
    def key(self) -> str:
        return _SEP.join(("r", self.rule, self.kind, self.id))

    def to_json(self) -> str:
        d = asdict(self)
        for k in ("paged_at", "ticket_at", "last_at"):
            d[k] = d[k].isoformat() if d[k] is not None else None
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> _Recent:
        d = json.loads(s)
        for k in ("paged_at", "ticket_at", "last_at"):
            d[k] = _dt(d.get(k))
        return cls(**d)


_STATE_TYPES: dict[str, Any] = {
    "i": _Instance,
    "g": _Group,
    "h": _Hold,
    "f": _Flap,
    "r": _Recent,
}


# ---- silences ------------------------------------------------------------------------------


class Silences:
    """Silences, kept in the store's ``alert_silences`` table (or in memory without a store)."""

    def __init__(self, db: AlertDb | None = None) -> None:
        self.db = db
        self._mem: dict[str, Silence] = {}

    def add(self, silence: Silence) -> Silence:
        """Store a silence; returns it with its ``id`` (a new UUID unless given)."""
        s = silence.model_copy(update={"id": silence.id or uuid.uuid4().hex})
        assert s.id is not None
        if self.db is None:
            self._mem[s.id] = s
        else:
            row = (s.id, json.dumps(s.matchers), s.starts_at, s.ends_at, s.created_by, s.comment)
            with self.db.transaction() as cur:
                store_alerts.put_silence(cur, row)
        return s

    def expire(self, silence_id: str, now: datetime | None = None) -> None:
        """End a silence now."""
        now = now or _now()
        if self.db is None:
            if silence_id in self._mem:
                self._mem[silence_id] = self._mem[silence_id].model_copy(update={"ends_at": now})
            return
        store_alerts.end_silence(self.db, silence_id, now)

    def all(self) -> list[Silence]:
        if self.db is None:
            return list(self._mem.values())
        rows = store_alerts.silence_rows(self.db)
        return [
            Silence(
                id=i,
                matchers=json.loads(m),
                starts_at=s,
                ends_at=e,
                created_by=by,
                comment=c,
            )
            for i, m, s, e, by, c in rows
        ]

    def active(self, now: datetime) -> list[Silence]:
        return [s for s in self.all() if s.active(now)]


def _covers(obs: Observation, min_s: float) -> bool:
    """The observation's figures cover at least ``min_s`` seconds (its ``covered_s`` label;
    an observation without one is judged)."""
    try:
        return float(obs.labels.get("covered_s", "inf")) >= min_s
    except ValueError:
        return True


def _silenced_members(
    silences: list[Silence], fields: dict[str, str], members: Iterable[str]
) -> set[str]:
    """Member ids muted by any silence whose group-level matchers all match ``fields``."""
    out: set[str] = set()
    ids = list(members)
    for s in silences:
        group_matchers = {k: v for k, v in s.matchers.items() if k != "entity_id"}
        if any(fields.get(k) != v for k, v in group_matchers.items()):
            continue
        want = s.matchers.get("entity_id")
        out.update(i for i in ids if want is None or i == want)
    return out


# ---- the engine ----------------------------------------------------------------------------


class AlertEngine:
    """Evaluates rules on observations; see the module docstring for the semantics.

    ``outbox``: where notifications are enqueued (and, through its store, where the engine's
    state and silences live). ``db``: the store for state and silences when there is no outbox
    (default: the outbox's; neither: in memory). ``clock``: returns the current aware UTC time.
    """

    def __init__(
        self,
        rules: RuleSet,
        topology: Topology,
        outbox: Outbox | None = None,
        clock: Clock = _now,
        *,
        db: AlertDb | None = None,
        console_url: str | None = None,
    ) -> None:
        self.rules = rules
        #: the console's base URL (``dctwin serve --console-url``): pages link the component
        self.console_url = console_url.rstrip("/") if console_url else None
        self.topology = topology
        self._group_keys: dict[tuple[str, ...], str] = {}  # _group_key's, by rule and entity
        self.outbox = outbox
        self.clock = clock
        self.db = db if db is not None else (outbox.db if outbox is not None else None)
        self.silences = Silences(self.db)
        self._instances: dict[str, _Instance] = {}
        self._groups: dict[str, _Group] = {}
        self._holds: dict[str, _Hold] = {}
        self._flaps: dict[str, _Flap] = {}
        self._recent: dict[str, _Recent] = {}
        self._dirty: set[str] = set()
        #: the time of the last evaluation (what "firing for" of open incidents counts to)
        self._evaluated_at: datetime | None = None
        self._index = rules.index()
        # evaluate runs in the detection thread, active/acknowledge in the API's threads
        self._lock = threading.RLock()
        self._load_state()

    @property
    def site(self) -> str:
        return self.topology.site_name

    # ---- rules ---------------------------------------------------------------------------

    def reload(self, path: str | Path | RuleSet) -> RuleSet:
        """Load a new rule file (or take a validated :class:`RuleSet`); on any error raise
        :class:`RuleFileError` and keep the old.

        Alerts of rules that are gone are dropped; their paged incidents resolve at the next
        evaluation.
        """
        new = path if isinstance(path, RuleSet) else load_rules(path)  # raises before changes
        with self._lock:  # not in the middle of an evaluation
            self.rules = new
            self._index = new.index()
            names = set(new.by_name())
            for key, inst in list(self._instances.items()):
                if inst.rule not in names:
                    del self._instances[key]
                    self._dirty.add(key)
        if not isinstance(path, RuleSet):
            log.info("alert rules reloaded from %s: %d rules", path, len(new))
        return new

    # ---- evaluation ----------------------------------------------------------------------

    def open_series(self) -> set[tuple[str, str, str]]:
        """``(metric, entity kind, entity id)`` of every open alert (pending, firing, or
        firing while it clears): the series whose next observation can change this engine's
        state whatever its value. An observation of any other series that meets no rule's
        firing condition changes nothing (:meth:`_step`), so a replay may leave it out."""
        rules = self.rules.by_name()
        with self._lock:
            return {
                (rules[i.rule].metric, i.entity_kind, i.entity_id)
                for i in self._instances.values()
                if i.rule in rules
            }

    def quiet(self) -> bool:
        """True when an evaluation without observations would send nothing, now or later, that
        the next evaluation would not: no open alert, incident, inhibition hold or flap count.
        (A recurrence window that ends is forgotten at any later evaluation before it pages.)"""
        with self._lock:
            return not (self._instances or self._groups or self._holds or self._flaps)

    def evaluate(
        self, observations: Iterable[Observation], now: datetime | None = None
    ) -> list[Notification]:
        """Run one evaluation; return the notifications to send (and enqueue them)."""
        with self._lock:
            return self._evaluate(observations, now)

    def _evaluate(
        self, observations: Iterable[Observation], now: datetime | None
    ) -> list[Notification]:
        now = (now or self.clock()).astimezone(UTC)
        self._evaluated_at = now
        rules = self.rules.by_name()
        cleared: dict[str, datetime] = {}  # group key -> when its last member cleared

        def clear(inst: _Instance, at: datetime) -> None:
            del self._instances[inst.key]
            self._dirty.add(inst.key)
            if inst.state != "firing":
                return
            rule = rules[inst.rule]
            if inst.clearing_since is None:
                self._flap_change(rule, inst, at, hot=False)
            gkey = self._group_key(rule, (inst.entity_kind, inst.entity_id))
            cleared[gkey] = max(cleared.get(gkey, at), at)
            hold_s = max((i.hold_s for i in rule.inhibits), default=0.0)
            if hold_s > 0:
                hold = _Hold(rule.name, inst.entity_kind, inst.entity_id, at + timedelta(0, hold_s))
                self._holds[hold.key] = hold
                self._dirty.add(hold.key)

        for obs in sorted(observations, key=lambda o: o.ts):
            for rule in self._index.get((obs.metric, obs.entity_kind), ()):
                self._step(rule, obs, clear)
        for inst in list(self._instances.values()):
            rule = rules.get(inst.rule)
            if rule is None:
                continue
            absent = rule.resolve_if_absent_s
            if absent is None or (now - inst.last_ts).total_seconds() < absent:
                continue
            gone = inst.last_ts + timedelta(seconds=absent)
            if inst.state != "firing":
                clear(inst, gone)
                continue
            if inst.clearing_since is None:  # absent counts as cleared: keep_firing_for runs
                inst.clearing_since = gone
                self._flap_change(rule, inst, gone, hot=False)
                self._dirty.add(inst.key)
            keep_s = self._keep_s(rule, inst)
            if (now - inst.clearing_since).total_seconds() >= keep_s:
                clear(inst, inst.clearing_since + timedelta(seconds=keep_s))
        for key, hold in list(self._holds.items()):
            if hold.until <= now:
                del self._holds[key]
                self._dirty.add(key)
        for key, rec in list(self._recent.items()):
            rrule = rules.get(rec.rule)
            window = rrule.recur_as_ticket_s if rrule is not None else None
            if window is None or (now - (rec.last_at or rec.paged_at)).total_seconds() >= window:
                del self._recent[key]  # a window without the state: the next one pages again
                self._dirty.add(key)
        for key, flap in list(self._flaps.items()):
            frule = rules.get(flap.rule)
            stale = frule is None or frule.flap_changes is None
            if not stale and not flap.hot and not flap.flapping:
                assert frule is not None
                stale = all((now - t).total_seconds() >= frule.flap_window_s for t in flap.changes)
            if stale:
                del self._flaps[key]
                self._dirty.add(key)

        notifications = self._notify(rules, now, cleared)
        self._commit(notifications, now)
        return notifications

    def _step(
        self, rule: Rule, obs: Observation, clear: Callable[[_Instance, datetime], None]
    ) -> None:
        key = _SEP.join(("i", rule.name, obs.entity_kind, obs.entity_id))
        inst = self._instances.get(key)
        if inst is not None and obs.ts < inst.last_ts:
            return  # older than what we already saw
        if rule.min_coverage_s is not None and not _covers(obs, rule.min_coverage_s):
            return  # too little data to judge yet: neither fire nor clear
        if inst is None:
            if not rule.breached(obs.value, obs.excess):
                return
            inst = _Instance(
                rule.name, obs.entity_kind, obs.entity_id, "pending", obs.ts, obs.value, obs.ts
            )
            self._instances[key] = inst
        elif inst.state == "pending" and not rule.breached(obs.value, obs.excess):
            clear(inst, obs.ts)
            return
        elif inst.state == "firing":
            if rule.still_breached(obs.value, obs.excess):
                if inst.clearing_since is not None:  # back within keep_firing_for: same alert
                    inst.clearing_since = None
                    self._flap_change(rule, inst, obs.ts, hot=True)
            else:
                if inst.clearing_since is None:
                    inst.clearing_since = obs.ts
                    self._flap_change(rule, inst, obs.ts, hot=False)
                if (obs.ts - inst.clearing_since).total_seconds() >= self._keep_s(rule, inst):
                    clear(inst, obs.ts)
                    return
        inst.value, inst.last_ts, inst.labels = obs.value, obs.ts, dict(obs.labels)
        if inst.state == "pending" and (obs.ts - inst.since).total_seconds() >= rule.for_s:
            inst.state, inst.fired_at = "firing", obs.ts
            self._flap_change(rule, inst, obs.ts, hot=True)
        self._dirty.add(key)

    # ---- keep_firing_for and flap detection ----------------------------------------------

    def _flap_of(self, rule: Rule, entity: Entity) -> tuple[str, _Flap | None]:
        fkey = "f" + self._group_key(rule, entity)[1:]
        return fkey, self._flaps.get(fkey)

    def _keep_s(self, rule: Rule, inst: _Instance) -> float:
        """How long a firing alert whose condition cleared stays firing: keep_firing_for_s,
        or flap_stable_s while its incident is flapping."""
        keep_s = rule.keep_firing_for_s
        if rule.flap_changes is not None:
            _, flap = self._flap_of(rule, (inst.entity_kind, inst.entity_id))
            if flap is not None and flap.flapping:
                keep_s = max(keep_s, rule.flap_hold_s)
        return keep_s

    def _flap_change(self, rule: Rule, inst: _Instance, ts: datetime, *, hot: bool) -> None:
        """Member ``inst`` starts (``hot``) or stops holding its condition at ``ts``: when its
        incident fires or clears by that, count one change; enough in the window: flapping."""
        if rule.flap_changes is None:
            return
        fkey, flap = self._flap_of(rule, (inst.entity_kind, inst.entity_id))
        if flap is None:
            _, _, kind, gid = fkey.split(_SEP)
            flap = self._flaps[fkey] = _Flap(rule.name, kind, gid)
        was_hot = bool(flap.hot)
        if hot and inst.entity_id not in flap.hot:
            flap.hot.append(inst.entity_id)
        elif not hot and inst.entity_id in flap.hot:
            flap.hot.remove(inst.entity_id)
        self._dirty.add(fkey)
        if was_hot == bool(flap.hot):
            return
        window_s = rule.flap_window_s
        flap.changes = [t for t in flap.changes if (ts - t).total_seconds() < window_s] + [ts]
        if len(flap.changes) >= rule.flap_changes:
            flap.flapping = True

    def _flapping(self, gkey: str) -> bool:
        flap = self._flaps.get("f" + gkey[1:])
        return flap is not None and flap.flapping

    def _group_key(self, rule: Rule, entity: Entity) -> str:
        # a walk up the topology per firing member and evaluation otherwise (the site's
        # topology is fixed for the engine's life; a rule's group_by is part of the key)
        memo = (rule.name, rule.group_by, *entity)
        key = self._group_keys.get(memo)
        if key is None:
            g = self.topology.group_of(entity, rule.group_by)
            key = self._group_keys[memo] = _SEP.join(("g", rule.name, g[0], g[1]))
        return key

    def _inhibited(self, rules: dict[str, Rule], now: datetime) -> set[str]:
        """Keys of firing instances muted by inhibition."""
        sources: list[tuple[Rule, Entity]] = []
        for inst in self._instances.values():
            rule = rules.get(inst.rule)
            if rule is not None and rule.inhibits and inst.state == "firing":
                sources.append((rule, (inst.entity_kind, inst.entity_id)))
        for hold in self._holds.values():
            rule = rules.get(hold.rule)
            if rule is not None and hold.until > now:
                sources.append((rule, (hold.entity_kind, hold.entity_id)))
        # the rule each source inhibits -> (source, along which tree): a firing alert is
        # checked against the sources that inhibit its own rule only
        inhibits: dict[str, list[tuple[Entity, Any]]] = {}
        for rule, source in sources:
            for i in rule.inhibits:
                inhibits.setdefault(i.rule, []).append((source, i.along))
        muted: set[str] = set()
        for inst in self._instances.values():
            pairs = inhibits.get(inst.rule)
            if inst.state != "firing" or not pairs:
                continue
            target = (inst.entity_kind, inst.entity_id)
            if any(self.topology.is_under(target, source, along) for source, along in pairs):
                muted.add(inst.key)
        return muted

    def _notify(
        self, rules: dict[str, Rule], now: datetime, cleared: dict[str, datetime]
    ) -> list[Notification]:
        firing: dict[str, list[_Instance]] = {}
        for inst in self._instances.values():
            if inst.state == "firing" and inst.rule in rules:
                rule = rules[inst.rule]
                firing.setdefault(
                    self._group_key(rule, (inst.entity_kind, inst.entity_id)), []
                ).append(inst)
        inhibited = self._inhibited(rules, now)
        silences = self.silences.active(now)
        out: list[Notification] = []

        # incidents whose members all cleared: resolve the paged ones, forget the others
        for gkey, group in list(self._groups.items()):
            if gkey in firing:
                continue
            del self._groups[gkey]
            self._dirty.add(gkey)
            flapping = self._flapping(gkey)
            if flapping:  # stable again: flapping ends, the count starts again
                del self._flaps["f" + gkey[1:]]
                self._dirty.add("f" + gkey[1:])
            if group.notified and not group.quiet:
                ends = cleared.get(gkey, group.cleared_at or now)
                out.append(self._resolved(group, ends, flapping))

        for gkey, members in sorted(firing.items()):
            rule = rules[members[0].rule]
            _, _, gkind, gid = gkey.split(_SEP)
            group = self._groups.get(gkey)
            if group is None:
                group = _Group(
                    rule=rule.name,
                    kind=gkind,
                    id=gid,
                    dedup_key=dedup_key(self.site, rule.name, (gkind, gid)),
                    severity=rule.severity,
                    first_fired_at=min(m.fired_at or m.since for m in members),
                )
                self._groups[gkey] = group
                self._dirty.add(gkey)
            fields = {
                **rule.labels,
                "rule": rule.name,
                "severity": rule.severity,
                "dedup_key": group.dedup_key,
                "group_kind": gkind,
                "group_id": gid,
            }
            silenced = _silenced_members(silences, fields, (m.entity_id for m in members))
            live = [m for m in members if m.key not in inhibited and m.entity_id not in silenced]
            self._note_muting(members, live, now)
            flapping = self._flapping(gkey)
            if group.notified:
                added = [m for m in live if m.entity_id not in group.members]
                if added:  # listed in the resolve; not paged again
                    group.members.update(self._members_json(added))
                    self._dirty.add(gkey)
                if self._remind(rule, group, now) and live and not flapping and not group.quiet:
                    group.repeat += 1
                    out.append(self._fire(rule, group, live, now, flapping))
                    self._dirty.add(gkey)
                continue
            waited = (now - group.first_fired_at).total_seconds() >= rule.group_wait_s
            # a new page needs a member whose condition holds now: one kept firing over a clear
            # (keep_firing_for) only holds an open page, it never starts one (else a forecast
            # muted by its breach would page once the breach resolved, for what is over); and
            # one muted until now pages on a value observed since, not on the one it was muted
            # with (a drift measured during a fault, unmeasurable since, is not news once the
            # fault's page resolves)
            if any(self._fresh(m) for m in live) and waited:
                note = self._recurrence(rule, group, self._fire(rule, group, live, now, flapping))
                if note is not None:
                    out.append(note)
                self._dirty.add(gkey)
        return out

    def _note_muting(self, members: list[_Instance], live: list[_Instance], now: datetime) -> None:
        """Keep each member's muting (inhibited or silenced) across evaluations, and when a
        muted member comes free, the time it did (``released_at``)."""
        free = {m.key for m in live}
        for m in members:
            muted = m.key not in free
            if muted == m.muted:
                continue
            m.muted = muted
            if not muted:
                m.released_at = now
            self._dirty.add(m.key)

    def _recurrence(self, rule: Rule, group: _Group, note: Notification) -> Notification | None:
        """``recur_as_ticket_s``: the first incident of a rule on a group pages; while the
        state keeps coming back (each within the window of the last), the next ones are a
        ticket (severity info) at most once per window, and the rest are kept quiet (listed
        by the API, never sent). A window without it, and the next one pages again."""
        window = rule.recur_as_ticket_s
        if window is None:
            return note
        now = group.sent_at or note.starts_at  # _fire set it: the evaluation's time
        key = _SEP.join(("r", rule.name, group.kind, group.id))
        rec = self._recent.get(key)
        self._dirty.add(key)
        if rec is None:
            self._recent[key] = _Recent(rule.name, group.kind, group.id, now, last_at=now)
            return note
        rec.last_at = now
        group.severity = "info"  # a ticket, or kept quiet: listed as info, never a page
        if rec.ticket_at is not None and (now - rec.ticket_at).total_seconds() < window:
            group.quiet = True
            return None
        rec.ticket_at = now
        return note.model_copy(
            update={
                "severity": "info",
                "summary": f"{note.summary} (recurring: paged {utc_iso(rec.paged_at)};"
                f" now a ticket, at most one per {window / 3600:g} h)",
            }
        )

    def _remind(self, rule: Rule, group: _Group, now: datetime) -> bool:
        """A reminder is due (repeat_interval_s since the last page, not acknowledged)."""
        if rule.repeat_interval_s is None or group.acknowledged:
            return False
        if group.sent_at is None:  # state from before reminders: count from now
            group.sent_at = now
            self._dirty.add(group.key)
            return False
        return (now - group.sent_at).total_seconds() >= rule.repeat_interval_s

    @staticmethod
    def _members_json(members: list[_Instance]) -> dict[str, dict[str, Any]]:
        return {
            m.entity_id: Member(
                entity_kind=m.entity_kind, entity_id=m.entity_id, value=m.value, since=m.since
            ).model_dump(mode="json")
            for m in members
        }

    def _fire(
        self, rule: Rule, group: _Group, live: list[_Instance], now: datetime, flapping: bool
    ) -> Notification:
        """The incident's page, or (once paged) a reminder: same dedup key and start, the
        members seen so far, ``repeat`` counting reminders."""
        reminder = group.notified
        live = self._headline_first(rule, live)
        worst = live[0]
        common = dict(worst.labels)
        for m in live[1:]:
            common = {k: v for k, v in common.items() if m.labels.get(k) == v}
        summary = self._summary(rule, group, live)
        entity = (group.kind, group.id)
        affected = ", ".join(f"{m.entity_id} ({m.value:g})" for m in live)
        description = (
            f"{summary}\n{self.topology.describe(entity)}.\n"
            f"{len(live)} {kind_word(worst.entity_kind)} alert(s) of rule {rule.name}"
            f" ({rule.metric} {rule.op} {rule.threshold:g}): {affected}"
        )
        labels = {**rule.labels, "group_kind": group.kind, "group_id": group.id}
        spec = METRICS.get(rule.metric)
        cdus = self.topology.cdus_of(entity)
        if cdus and group.kind != "cdu":
            labels["cdu"] = ",".join(cdus)  # a rack's page names the CDU that cools it
        if group.kind in ("cdu", "pdu", "pdu_phase", "fleet", "loop"):
            racks = self.topology.children_of_kind(
                (group.kind if group.kind != "loop" else "cdu", split_sub_id(group.id)[0]),
                ["rack"],
            )
            if racks:
                labels["racks"] = ",".join(racks)
        group.notified = True
        if reminder:
            group.members.update(self._members_json(live))
        else:
            group.starts_at = min(m.since for m in live)
            group.members = self._members_json(live)
        assert group.starts_at is not None
        group.summary, group.description, group.labels = summary, description, labels
        group.context = common
        group.sent_at = now
        return Notification(
            status="firing",
            dedup_key=group.dedup_key,
            event_id=event_id(group.dedup_key, "firing", group.starts_at, group.repeat),
            site=self.site,
            rule=rule.name,
            severity=rule.severity,  # type: ignore[arg-type]
            group=GroupRef(kind=group.kind, id=group.id),
            members=[Member.model_validate(v) for v in group.members.values()],
            summary=summary,
            description=description,
            starts_at=group.starts_at,
            labels=labels,
            context=common,
            unit=spec.unit if spec is not None else None,
            url=self._url(entity),
            runbook_url=rule.runbook_url,
            repeat=group.repeat,
            flapping=flapping,
        )

    def _url(self, entity: Entity) -> str | None:
        if self.console_url is None:
            return None
        return self.console_url + self.topology.console_path(entity)

    @staticmethod
    def _fresh(m: _Instance) -> bool:
        """The member's condition holds on a value seen since its last mute ended: not kept
        firing over a clear, and observed since it came free."""
        return m.clearing_since is None and (m.released_at is None or m.last_ts >= m.released_at)

    @classmethod
    def _headline_first(cls, rule: Rule, members: list[_Instance]) -> list[_Instance]:
        """Members in the order a page names them: those breached on a fresh value first,
        then the rest (held over a clear, or muted until now and not seen since), each worst
        first, so the summary never quotes a value from before a mute when a fresh one paged."""
        above = rule.op in (">", ">=")
        return sorted(
            members,
            key=lambda m: (not cls._fresh(m), -m.value if above else m.value, m.entity_id),
        )

    @staticmethod
    def _summary(rule: Rule, group: _Group, live: list[_Instance]) -> str:
        """The incident's one line from its worst member now (``live`` worst first): the
        template over that member's value and labels, and how many more share the incident."""
        worst = live[0]
        ctx = {
            "rule": rule.name,
            "entity_kind": worst.entity_kind,
            "entity_id": worst.entity_id,
            "value": worst.value,
            "threshold": rule.threshold,
            "severity": rule.severity,
            "group_kind": group.kind,
            "group_id": group.id,
            "count": len(live),
            "labels": worst.labels,
        }
        summary = render_summary(rule.summary, ctx)
        if len(live) > 1 and "{count" not in rule.summary:
            summary += f" (+{len(live) - 1} more in {kind_word(group.kind)} {group.id})"
        return summary

    def _resolved(self, group: _Group, ends_at: datetime, flapping: bool) -> Notification:
        assert group.starts_at is not None
        rule = self.rules.by_name().get(group.rule)
        spec = METRICS.get(rule.metric) if rule is not None else None
        return Notification(
            status="resolved",
            dedup_key=group.dedup_key,
            event_id=event_id(group.dedup_key, "resolved", group.starts_at),
            site=self.site,
            rule=group.rule,
            severity=group.severity,  # type: ignore[arg-type]
            group=GroupRef(kind=group.kind, id=group.id),
            members=[Member.model_validate(v) for v in group.members.values()],
            summary=f"RESOLVED: {group.summary}",
            description=f"Resolved at {utc_iso(ends_at)}.\n{group.description}",
            starts_at=group.starts_at,
            ends_at=max(ends_at, group.starts_at),
            labels=group.labels,
            context=group.context,
            unit=spec.unit if spec is not None else None,
            url=self._url((group.kind, group.id)),
            runbook_url=rule.runbook_url if rule is not None else None,
            flapping=flapping,
        )

    # ---- acknowledge ---------------------------------------------------------------------

    def acknowledge(self, dedup_key: str, now: datetime | None = None) -> int:
        """Enqueue an acknowledge event for an incident (PagerDuty, webhooks); rows written."""
        now = now or self.clock()
        with self._lock:  # an acknowledged incident gets no more reminders
            for group in self._groups.values():
                if group.dedup_key == dedup_key and not group.acknowledged:
                    group.acknowledged = True
                    self._dirty.add(group.key)
            if self._dirty:
                self._commit([], now)  # kept across a restart
        if self.outbox is None:
            return 0
        return self.outbox.acknowledge(dedup_key, now)

    def active(self) -> list[dict[str, Any]]:
        """Open incidents (paged or not) with their members, for the API and the console."""
        with self._lock:
            return self._active()

    def _active(self) -> list[dict[str, Any]]:
        """Each open incident as it stands at the last evaluation: its summary rendered again
        from its worst member's current value (the page's own line is ``paged_summary``), the
        current value with its unit, and how long it has been firing."""
        rules = self.rules.by_name()
        firing: dict[str, list[_Instance]] = {}
        for inst in self._instances.values():
            rule = rules.get(inst.rule)
            if inst.state == "firing" and rule is not None:
                gkey = self._group_key(rule, (inst.entity_kind, inst.entity_id))
                firing.setdefault(gkey, []).append(inst)
        now = self._evaluated_at
        out = []
        for key, g in self._groups.items():
            rule = rules.get(g.rule)
            members = firing.get(key, [])
            started = g.starts_at or g.first_fired_at
            row: dict[str, Any] = {
                "dedup_key": g.dedup_key,
                "rule": g.rule,
                "severity": g.severity,
                "group": {"kind": g.kind, "id": g.id},
                "notified": g.notified,
                "starts_at": utc_iso(started),
                "members": sorted(g.members),
                "racks": self.topology.racks_of((g.kind, g.id)),
                "cdus": self.topology.cdus_of((g.kind, g.id)),
                "summary": g.summary or None,
                "paged_summary": g.summary or None,
                "value": None,
                "firing_for_s": (
                    max(0.0, (now - started).total_seconds()) if now is not None else None
                ),
                "evaluated_at": utc_iso(now) if now is not None else None,
                "flapping": self._flapping(key),
                "repeat": g.repeat,
                "runbook_url": rule.runbook_url if rule is not None else None,
                "values": {mid: self._value_now(g, mid, m) for mid, m in g.members.items()},
            }
            spec = METRICS.get(rule.metric) if rule is not None else None
            row["unit"] = spec.unit if spec is not None else None
            if rule is not None and members:
                live = self._headline_first(rule, members)
                row["summary"] = self._summary(rule, g, live)
                row["value"] = live[0].value
            out.append(row)
        return out

    def _value_now(self, g: _Group, member: str, paged: dict[str, Any]) -> float | None:
        """A member's latest observed value (its live instance's), else the value it was
        paged with."""
        inst = self._instances.get(_SEP.join(("i", g.rule, paged.get("entity_kind", ""), member)))
        value = inst.value if inst is not None else paged.get("value")
        return float(value) if value is not None else None

    # ---- persistence ---------------------------------------------------------------------

    def _load_state(self) -> None:
        if self.db is None:
            return
        for key, kind, state in store_alerts.state_rows(self.db):
            obj = _STATE_TYPES[kind].from_json(state)
            {
                "i": self._instances,
                "g": self._groups,
                "h": self._holds,
                "f": self._flaps,
                "r": self._recent,
            }[kind][key] = obj

    def _commit(self, notifications: list[Notification], now: datetime) -> None:
        dirty, self._dirty = self._dirty, set()
        if self.db is None:
            if self.outbox is not None and notifications:
                self.outbox.enqueue_many(notifications, now)
            return
        live: dict[str, Any] = {
            **self._instances,
            **self._groups,
            **self._holds,
            **self._flaps,
            **self._recent,
        }
        try:
            with self.db.transaction() as cur:
                for key in sorted(dirty):
                    obj = live.get(key)
                    store_alerts.put_state(cur, key, None if obj is None else obj.to_json(), now)
                for note in notifications:
                    store_alerts.add_history(
                        cur,
                        [
                            now,
                            note.dedup_key,
                            note.status,
                            note.event_id,
                            note.rule,
                            note.severity,
                            note.model_dump_json(),
                        ],
                    )
                if self.outbox is not None and notifications:
                    self.outbox.enqueue_many(notifications, now)
        except duckdb.Error:
            self._dirty |= dirty  # retry the state write at the next evaluation
            raise
