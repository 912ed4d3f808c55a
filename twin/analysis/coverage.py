"""Which telemetry kinds the store holds recently, and what detection cannot compute without each.

Real sites often lack a kind for days (no metered PDUs, no switch telemetry) or lose one for a
while. Detection runs on whatever exists; this module says what is missing so that the
service's health names it (:meth:`twin.health.ServiceHealth.set_missing`) instead of a pass
failing or quietly computing less.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from collectors.contract import KINDS
from twin.site import Site
from twin.store import Store
from twin.store.reads import has_samples, newest_ts


class NoTelemetry(ValueError):
    """The store holds no telemetry of any kind yet: there is nothing to detect on."""


#: A kind with no sample in this long before the newest sample of any kind counts as missing:
#: the "now" values of the headroom and the pump states are averaged over the last minute. [s]
MISSING_AFTER_S = 60.0

#: What the detection pass cannot compute without each kind.
NOT_COMPUTED: dict[str, str] = {
    "gpu": (
        "no GPU headroom (K to slowdown, time to breach), GPU hot spots, model residuals"
        " or fleet underuse"
    ),
    "node": (
        "no rack IT load from node power (PDU power used instead), no node inlet air (PDU"
        " inlet used instead), no load forecast"
    ),
    "pdu": (
        "no rack kW or PDU phase and breaker headroom; CDU heat held at its measured value"
        " instead of following the rack load"
    ),
    "cdu": (
        "no CDU capacity, flow or loop return headroom and no pump states (cdu_pump_lost"
        " cannot fire); liquid-cooled GPUs' time to breach has no coolant reference"
    ),
    "link": "no link traffic headroom",
}


def newest_sample(store: Store, kinds: tuple[str, ...] = KINDS) -> datetime | None:
    """Timestamp of the newest sample of any of ``kinds``; None when the store has none."""
    newest: datetime | None = None
    for kind in kinds:
        ts = newest_ts(store, kind)
        if ts is not None and (newest is None or ts > newest):
            newest = ts
    return newest


def expected_kinds(site: Site) -> list[str]:
    """The kinds ``site`` has devices for (a site without CDUs expects no CDU telemetry)."""
    has = {
        "gpu": any(n.gpu_ids() for n in site.nodes),
        "node": bool(site.nodes),
        "pdu": bool(site.pdus),
        "cdu": bool(site.cdus),
        "link": bool(site.links),
    }
    return [k for k in KINDS if has[k]]


def missing_kinds(
    store: Store, site: Site, now: datetime, window_s: float = MISSING_AFTER_S
) -> dict[str, str]:
    """Each kind the site expects with no sample in ``(now - window_s, now]``, with the health
    text ``no <kind> telemetry in the last N s: <what is not computed>``."""
    start = now - timedelta(seconds=window_s)
    out: dict[str, str] = {}
    for kind in expected_kinds(site):
        if not has_samples(store, kind, start, now):
            out[kind] = f"no {kind} telemetry in the last {window_s:g} s: {NOT_COMPUTED[kind]}"
    return out
