"""The wire contract: topics, timestamps, types and the reasons for refusing a message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest

from collectors.contract import (
    DEAD_LETTER_REASONS,
    KINDS,
    QUANTITIES,
    ContractError,
    decode,
    encode,
    parse_topic,
    topic_for,
)

TOPIC = "dctwin/v1/demo/gpu/gpu-node-017"


def body(**over):
    b = {
        "v": 1,
        "collector": "nvml",
        "source": "gpu-node-017",
        "seq": 42,
        "ts": "2026-11-29T14:00:00.250Z",
        "samples": [{"id": "GPU-1", "power_w": 612.5, "temp_c": 61.0, "util_pct": 97}],
    }
    b.update(over)
    return orjson.dumps(b)


def reason(payload: bytes, topic: str = TOPIC) -> str:
    with pytest.raises(ContractError) as e:
        decode(topic, payload)
    assert e.value.reason in DEAD_LETTER_REASONS
    return e.value.reason


def test_the_issue_example_decodes():
    m = decode(TOPIC, body())
    assert (m.site, m.kind, m.source, m.collector, m.seq) == (
        "demo",
        "gpu",
        "gpu-node-017",
        "nvml",
        42,
    )
    assert m.ts == datetime(2026, 11, 29, 14, 0, 0, 250000, tzinfo=UTC)
    s = m.samples[0]
    assert (s["id"], s["power_w"], s["temp_c"], s["util_pct"], s["mem_temp_c"]) == (
        "GPU-1",
        612.5,
        61.0,
        97.0,
        None,
    )


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        ("2026-11-29T14:00:00Z", datetime(2026, 11, 29, 14, tzinfo=UTC)),
        ("2026-11-29T15:00:00+01:00", datetime(2026, 11, 29, 14, tzinfo=UTC)),
        (1795960800, datetime(2026, 11, 29, 14, tzinfo=UTC)),
        (1795960800.5, datetime(2026, 11, 29, 14, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_timestamps_rfc3339_or_unix_seconds_to_utc(ts, expected):
    m = decode(TOPIC, body(ts=ts))
    assert m.ts == expected
    assert m.ts.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "ts", ["2026-11-29t14:00:00z", "2026-11-29T14:00:00.123456789Z", "2026-11-29T15:00:00+01:00"]
)
def test_rfc3339_lowercase_and_long_fractions_are_accepted(ts):
    assert decode(TOPIC, body(ts=ts)).ts.replace(microsecond=0) == datetime(
        2026, 11, 29, 14, tzinfo=UTC
    )


def test_a_topic_of_another_site_is_wrong_site():
    with pytest.raises(ContractError) as e:
        decode(TOPIC.replace("/demo/", "/othersite/"), body(), site="demo")
    assert e.value.reason == "wrong_site"


def test_a_sample_may_carry_its_own_ts():
    m = decode(TOPIC, body(samples=[{"id": "a", "power_w": 1.0, "ts": 1795960801}]))
    assert m.samples[0]["ts"] == datetime(2026, 11, 29, 14, 0, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (body(ts="2026-11-29T14:00:00"), "bad_timestamp"),  # no offset: not RFC 3339
        (body(ts=True), "bad_timestamp"),
        # what once passed validation and then failed in the store, or was laxly stored
        (body(seq=2**63), "out_of_range"),
        (body(samples=[{"id": "a", "throttle_reasons": 2**63}]), "out_of_range"),
        (body(samples=[{"id": "a", "power_w": 1e308}]), "out_of_range"),
        (body(samples=[{"id": "a", "temp_c": -300.0}]), "out_of_range"),
        (body(samples=[{"id": "a", "fan_rpm": 1e300}]), "out_of_range"),
        (body(ts=1e20), "ts_future"),
        (body(ts=-1.0), "ts_past"),
        (body(ts="9999-12-31T23:59:59-01:00"), "bad_timestamp"),
        (body(ts="2300-01-01T00:00:00Z"), "ts_future"),
        (body(samples=[{"id": "a", "ts": "0001-01-01T00:00:00+01:00"}]), "bad_timestamp"),
        (body(ts="2026-W48-1T10:00:00Z"), "bad_timestamp"),  # ISO week date
        (body(ts="20261129T140000Z"), "bad_timestamp"),  # ISO basic format
        (body(ts="2026-11-29T14:00:00+01:00:30"), "bad_timestamp"),  # seconds in the offset
        (body(ts="2026-11-29 14:00:00Z"), "bad_timestamp"),
        (body(v=True), "bad_version"),
        (body(v=1.0), "bad_version"),
        (body().replace(b'"v":1,', b'"v":2,"v":1,'), "duplicate_key"),
        (
            body(samples=[{"id": "a", "power_w": 1.0}]).replace(
                b'"power_w":1.0', b'"power_w":2.0, "power_w":1.0'
            ),
            "duplicate_key",
        ),
        (body(seq="42"), "wrong_type"),
        (body(seq=-1), "wrong_type"),
        (body(samples=[{"id": "a", "power_w": "612.5"}]), "wrong_type"),
        (body(samples=[{"id": "a", "power_w": True}]), "wrong_type"),
        (body(samples=[{"id": "a", "throttle_reasons": 1.5}]), "wrong_type"),
        (body(samples=[{"id": "a", "fan_rpm": "fast"}]), "wrong_type"),
        (body(samples=[{"id": "a", "fan_rpm": {"x": 1}}]), "wrong_type"),
        (body(samples=[{"id": 7, "power_w": 1.0}]), "wrong_type"),
        (body(samples=[{"id": "a", "power_w": -0.5}]), "negative_value"),
        (body(samples=[{"id": "a", "flow_lpm": 1.0, "energy_j": -1.0}]), "negative_value"),
        (body(samples=[]), "missing_field"),
        (body(samples=[{"power_w": 1.0}]), "missing_field"),
        (body(v=2), "bad_version"),
        (body(extra_header=1), "wrong_type"),
        (b"[1, 2]", "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        (body().replace(b"612.5", b"NaN"), "non_finite"),
        (body().replace(b"612.5", b"-Infinity"), "non_finite"),
        (body().replace(b"612.5", b"1e999"), "non_finite"),
        (body(source="other"), "source_mismatch"),
    ],
)
def test_refusals_name_their_reason(payload, expected):
    assert reason(payload) == expected


def test_refusal_detail_names_the_field():
    with pytest.raises(ContractError) as e:
        decode(TOPIC, body(samples=[{"id": "a"}, {"id": "b", "temp_c": "hot"}]))
    assert "samples.1.temp_c" in e.value.detail


def test_topics():
    assert topic_for("demo", "cdu", "cdu-1") == "dctwin/v1/demo/cdu/cdu-1"
    assert parse_topic("dctwin/v1/demo/cdu/cdu-1") == ("demo", "cdu", "cdu-1")
    for bad in [
        "dctwin/v1/demo/cdu",
        "dctwin/v2/demo/cdu/x",
        "x/v1/demo/cdu/x",
        "dctwin/v1/demo/cdu/x/y",
        "dctwin/v1//cdu/x",
    ]:
        with pytest.raises(ContractError) as e:
            parse_topic(bad)
        assert e.value.reason == "bad_topic"
    with pytest.raises(ContractError) as e:
        parse_topic("dctwin/v1/demo/fan/x")
    assert e.value.reason == "unknown_kind"
    with pytest.raises(ValueError, match="source"):
        topic_for("demo", "gpu", "a/b")


def test_encode_roundtrip_every_kind():
    ts = datetime(2026, 11, 29, 14, 0, 0, 250000, tzinfo=timezone(timedelta(hours=2)))
    for kind in KINDS:
        sample = {"id": "x"} | {
            name: (3 if q.integer else 1.5) for name, q in QUANTITIES[kind].items()
        }
        m = decode(
            topic_for("s", kind, "src"),
            encode(collector="c", source="src", seq=7, ts=ts, samples=[sample]),
        )
        assert m.ts == ts.astimezone(UTC)
        got = {k: v for k, v in m.samples[0].items() if k != "ts"}
        assert got == sample


def test_every_quantity_name_carries_a_unit_suffix_or_is_dimensionless():
    suffixes = (
        "_w",
        "_c",
        "_pct",
        "_j",
        "_mhz",
        "_mib",
        "_a",
        "_v",
        "_va",
        "_kwh",
        "_hz",
        "_lpm",
        "_kpa",
        "_kw",
        "_bps",
        "_total",
    )
    dimensionless = {"sm_active", "throttle_reasons", "power_factor", "errors"}
    for kind, quantities in QUANTITIES.items():
        for name in quantities:
            assert name.endswith(suffixes) or name in dimensionless, (kind, name)


# ---- units of quantity names ---------------------------------------------------------------


def test_every_contract_quantity_agrees_with_its_name_suffix() -> None:
    from collectors.contract import QUANTITIES, SUFFIX_UNITS, UNIT_BOUNDS, unit_of

    checked = 0
    for kind, quantities in QUANTITIES.items():
        for name, q in quantities.items():
            assert q.integer or q.unit in UNIT_BOUNDS, (kind, name)
            assert unit_of(name, kind) == q.unit
            by_suffix = unit_of(name)
            if by_suffix is not None:  # sm_active, throttle_reasons, ecc_*_total: no suffix
                assert by_suffix == q.unit, (kind, name, by_suffix, q.unit)
                checked += 1
    assert checked >= 30  # most names carry their unit (35 of 41 today)
    assert set(SUFFIX_UNITS.values()) >= {
        q.unit for qs in QUANTITIES.values() for q in qs.values()
    } - {"1"}


def test_unit_of_derived_names_and_names_without_a_unit() -> None:
    from collectors.contract import unit_of

    assert unit_of("headroom_kw") == "kW" and unit_of("power_w") == "W"
    assert unit_of("energy_kwh") == "kWh" and unit_of("traffic_gbps") == "Gb/s"
    assert unit_of("breach_in_s") == "s" and unit_of("headroom_k") == "K"
    assert unit_of("sm_active") is None and unit_of("sm_active", "gpu") == "1"


def test_the_consoles_suffix_map_is_the_contracts() -> None:
    # the console imports nothing of collectors/ (it talks to the API), so it keeps a copy
    from collectors.contract import SUFFIX_UNITS
    from dashboards.ui import SUFFIX_UNITS as CONSOLE
    from dashboards.ui import unit_of

    assert CONSOLE == SUFFIX_UNITS
    assert unit_of("flow_lpm") == "L/min" and unit_of("sm_active") == ""


def test_the_snmp_collector_takes_its_units_from_the_contract() -> None:
    from collectors.snmp import contract_unit

    assert contract_unit("current_a") == "A" and contract_unit("power_factor_l1") == "1"
    assert contract_unit("outlet_energy_kwh") == "kWh"
    with pytest.raises(ValueError, match="names no unit"):
        contract_unit("status")


# ---- sample ids ------------------------------------------------------------------------------


def test_gpu_ids_build_and_split() -> None:
    from collectors.contract import gpu_id, split_gpu_id

    assert gpu_id("trn-r01-n1", 3) == "trn-r01-n1:3"
    assert split_gpu_id("trn-r01-n1:3") == ("trn-r01-n1", 3)
    assert split_gpu_id(gpu_id("host:with:colons", 12)) == ("host:with:colons", 12)
    for not_an_index in ("GPU-5e0c2a4b-1f2e", "node:", ":3", "node:x", "node"):
        assert split_gpu_id(not_an_index) is None, not_an_index


def test_phase_breaker_and_pump_ids_build_and_split() -> None:
    from collectors.contract import (
        cdu_sample_ids,
        pdu_sample_ids,
        phase_id,
        phase_ids,
        phase_label,
        phase_leg,
        split_phase_id,
        split_sub_id,
    )

    assert phase_id("pdu-r01-a", 2) == "pdu-r01-a/L2" and phase_label(3) == "L3"
    assert phase_ids("p", 3) == ["p/L1", "p/L2", "p/L3"] and phase_ids("p", 1) == ["p/L1"]
    assert split_phase_id("pdu-r01-a/L2") == ("pdu-r01-a", 2)
    for not_a_phase in ("pdu-r01-a", "pdu-r01-a/cb1", "p/L0", "p/L01", "p/l1", "p/L2x"):
        assert split_phase_id(not_a_phase) is None, not_a_phase
    assert phase_leg("L12") == 12 and phase_leg("cb1") is None
    with pytest.raises(ValueError, match="from 1"):
        phase_id("p", 0)
    assert split_sub_id("cdu-1/pump2") == ("cdu-1", "pump2")
    assert split_sub_id("cdu-1") == ("cdu-1", None)
    assert split_sub_id("node:0/mig1") == ("node:0", "mig1")
    assert pdu_sample_ids("p", 3, ["cb1", "cb2"]) == ["p", "p/L1", "p/L2", "p/L3", "p/cb1", "p/cb2"]
    assert cdu_sample_ids("c", ["pump1", "pump2"]) == ["c", "c/pump1", "c/pump2"]


def test_the_site_knows_the_ids_the_grammar_builds() -> None:
    from collectors.contract import cdu_sample_ids, gpu_id, pdu_sample_ids
    from twin.site import load_site

    from .helpers import SMALL_SITE

    site = load_site(SMALL_SITE)
    known = site.known_ids
    for p in site.pdus:
        assert set(pdu_sample_ids(p.name, p.phases, [b.name for b in p.breakers])) <= known["pdu"]
        assert site.is_known("pdu", f"{p.name}/outlet7")
        assert not site.is_known("pdu", f"{p.name}/L{p.phases + 1}")
    for c in site.cdus:
        assert set(cdu_sample_ids(c.name, c.pumps)) <= known["cdu"]
    n = site.nodes[0]
    assert gpu_id(n.name, 0) in known["gpu"] and n.gpu_ids()[0] == gpu_id(n.name, 0)
    assert not site.is_known("pdu", "ghost/outlet1")
