"""DuckDB schema of the store, derived from the wire contract so the two cannot disagree.

One typed table per kind (one row per device per timestamp, one column per quantity), a long
table for quantities the contract does not name, the ingest log (one row per stored message:
gaps and duplicates by ``seq``), dead letters, unknown ids, and 1-minute / 1-hour rollups;
the calibration, headroom and alert tables. Every CREATE statement of the project is here.
"""

from __future__ import annotations

import pyarrow as pa

from collectors.contract import CONTRACT_VERSION, KINDS, QUANTITIES

SCHEMA_VERSION = 1
ROLLUPS: dict[str, str] = {"1m": "1 minute", "1h": "1 hour"}
KEY_COLUMNS = ("ts", "source", "id")


def quantity_columns(kind: str) -> list[str]:
    return list(QUANTITIES[kind])


def _sql_type(kind: str, name: str) -> str:
    return "BIGINT" if QUANTITIES[kind][name].integer else "DOUBLE"


def arrow_schema(kind: str) -> pa.Schema:
    """The Arrow schema of a batch for the raw table of ``kind``."""
    fields = [
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
    ]
    for name, q in QUANTITIES[kind].items():
        fields.append(pa.field(name, pa.int64() if q.integer else pa.float64()))
    return pa.schema(fields)


EXTRA_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("quantity", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
)

LOG_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("received_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("collector", pa.string(), nullable=False),
        pa.field("n_samples", pa.int32(), nullable=False),
    ]
)

#: A dead letter keeps at most this many bytes of its payload (with its size and SHA-256), so a
#: hostile publisher cannot grow the store by what it sends.
DEAD_PAYLOAD_KEEP_BYTES = 4096
#: A dead letter's topic is cut to this many characters.
DEAD_TOPIC_KEEP_CHARS = 1024

DEAD_SCHEMA = pa.schema(
    [
        pa.field("received_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),  # the first DEAD_PAYLOAD_KEEP_BYTES
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("payload_bytes", pa.int64()),  # the whole payload's size
        pa.field("sha256", pa.string()),  # of the whole payload, hex
    ]
)

#: One row per limit of a stored headroom report (``twin.analysis.headroom.HeadroomRow``).
HEADROOM_SCHEMA = pa.schema(
    [
        pa.field("computed_at", pa.timestamp("us", tz="UTC")),
        pa.field("data_until", pa.timestamp("us", tz="UTC")),
        pa.field("kind", pa.string()),
        pa.field("id", pa.string()),
        pa.field("quantity", pa.string()),
        pa.field("unit", pa.string()),
        pa.field("limit_value", pa.float64()),
        pa.field("value_now", pa.float64()),
        pa.field("headroom_now", pa.float64()),
        pa.field("headroom_min_p50", pa.float64()),
        pa.field("headroom_min_p90", pa.float64()),
        pa.field("breach_in_s_p50", pa.float64()),
        pa.field("breach_in_s_p90", pa.float64()),
        pa.field("rack", pa.string()),
        pa.field("cdu", pa.string()),
        pa.field("basis", pa.string()),
    ]
)

UNKNOWN_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("first_seen", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("last_seen", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("samples", pa.int64(), nullable=False),
    ]
)


#: The alert engine's tables (twin/alerts: outbox, history, state, silences) and the API's
#: acknowledgements; twin/alerts/db.py documents the columns.
ALERT_DDL: tuple[str, ...] = (
    "CREATE SEQUENCE IF NOT EXISTS alert_outbox_seq",
    "CREATE TABLE IF NOT EXISTS alert_outbox (id BIGINT PRIMARY KEY"
    " DEFAULT nextval('alert_outbox_seq'), hook VARCHAR NOT NULL, dedup_key VARCHAR NOT NULL,"
    " status VARCHAR NOT NULL, event_id VARCHAR NOT NULL, payload VARCHAR NOT NULL,"
    " created_at TIMESTAMPTZ NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
    " next_attempt_at TIMESTAMPTZ NOT NULL, last_error VARCHAR, last_status_code INTEGER,"
    " delivered_at TIMESTAMPTZ, state VARCHAR NOT NULL DEFAULT 'pending',"
    " next_resend_at TIMESTAMPTZ)",
    # every notification the engine made, hooks or none: the alert history
    "CREATE TABLE IF NOT EXISTS alert_history (created_at TIMESTAMPTZ NOT NULL,"
    " dedup_key VARCHAR NOT NULL, status VARCHAR NOT NULL, event_id VARCHAR NOT NULL,"
    " rule VARCHAR NOT NULL, severity VARCHAR NOT NULL, payload VARCHAR NOT NULL)",
    "CREATE TABLE IF NOT EXISTS alert_state (key VARCHAR PRIMARY KEY, kind VARCHAR NOT NULL,"
    " state VARCHAR NOT NULL, updated_at TIMESTAMPTZ NOT NULL)",
    "CREATE TABLE IF NOT EXISTS alert_silences (id VARCHAR PRIMARY KEY,"
    " matchers VARCHAR NOT NULL, starts_at TIMESTAMPTZ NOT NULL, ends_at TIMESTAMPTZ NOT NULL,"
    " created_by VARCHAR NOT NULL, comment VARCHAR NOT NULL)",
    # acknowledgements recorded through the API (twin/api)
    "CREATE TABLE IF NOT EXISTS alert_acks (dedup_key VARCHAR NOT NULL,"
    " incident_start TIMESTAMPTZ, acked_at TIMESTAMPTZ NOT NULL, acked_by VARCHAR NOT NULL,"
    " comment VARCHAR NOT NULL)",
)
#: The acknowledgements table's DDL alone (one of :data:`ALERT_DDL`).
ALERT_ACKS_DDL = ALERT_DDL[-1]


def ddl() -> list[str]:
    """CREATE statements for every table (idempotent)."""
    stmts = [
        "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
        "CREATE TABLE IF NOT EXISTS extra_readings (ts TIMESTAMPTZ NOT NULL, kind VARCHAR NOT NULL,"
        " source VARCHAR NOT NULL, id VARCHAR NOT NULL, quantity VARCHAR NOT NULL,"
        " value DOUBLE NOT NULL)",
        "CREATE TABLE IF NOT EXISTS ingest_log (source VARCHAR NOT NULL, kind VARCHAR NOT NULL,"
        " seq BIGINT NOT NULL, ts TIMESTAMPTZ NOT NULL, received_at TIMESTAMPTZ NOT NULL,"
        " collector VARCHAR NOT NULL, n_samples INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS dead_letters (received_at TIMESTAMPTZ NOT NULL,"
        " topic VARCHAR NOT NULL, payload BLOB NOT NULL, reason VARCHAR NOT NULL,"
        " detail VARCHAR NOT NULL, payload_bytes BIGINT, sha256 VARCHAR)",
        # stores made before dead letters kept their size and hash
        "ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS payload_bytes BIGINT",
        "ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS sha256 VARCHAR",
        "CREATE TABLE IF NOT EXISTS unknown_ids (kind VARCHAR NOT NULL, id VARCHAR NOT NULL,"
        " source VARCHAR NOT NULL, first_seen TIMESTAMPTZ NOT NULL,"
        " last_seen TIMESTAMPTZ NOT NULL, samples BIGINT NOT NULL, PRIMARY KEY (kind, id))",
        "CREATE TABLE IF NOT EXISTS rollup_watermarks (kind VARCHAR NOT NULL,"
        " resolution VARCHAR NOT NULL, done_until TIMESTAMPTZ NOT NULL,"
        " PRIMARY KEY (kind, resolution))",
        # calibration: versioned parameters with their fit quality (twin/calibrate)
        "CREATE TABLE IF NOT EXISTS calibration_runs (run_id BIGINT PRIMARY KEY,"
        " fitted_at TIMESTAMPTZ NOT NULL, window_start TIMESTAMPTZ NOT NULL,"
        " window_end TIMESTAMPTZ NOT NULL, holdout_start TIMESTAMPTZ NOT NULL,"
        " gpus INTEGER NOT NULL, seconds DOUBLE NOT NULL, source VARCHAR NOT NULL DEFAULT 'fit',"
        " seeded_from VARCHAR, seeded_at TIMESTAMPTZ)",
        # stores made before a run said where it came from: every run of theirs was a fit
        "ALTER TABLE calibration_runs ADD COLUMN IF NOT EXISTS source VARCHAR DEFAULT 'fit'",
        "ALTER TABLE calibration_runs ADD COLUMN IF NOT EXISTS seeded_from VARCHAR",
        "ALTER TABLE calibration_runs ADD COLUMN IF NOT EXISTS seeded_at TIMESTAMPTZ",
        "CREATE TABLE IF NOT EXISTS calibration_params (run_id BIGINT NOT NULL,"
        " kind VARCHAR NOT NULL, id VARCHAR NOT NULL, param VARCHAR NOT NULL, value DOUBLE,"
        " stderr DOUBLE, usable BOOLEAN NOT NULL, reason VARCHAR)",
        "CREATE TABLE IF NOT EXISTS calibration_quality (run_id BIGINT NOT NULL,"
        " kind VARCHAR NOT NULL, id VARCHAR NOT NULL, quantity VARCHAR NOT NULL, mae DOUBLE,"
        " cv_rmse DOUBLE, nmbe DOUBLE, mape DOUBLE, n BIGINT)",
        "CREATE TABLE IF NOT EXISTS calibration_events (run_id BIGINT NOT NULL,"
        " kind VARCHAR NOT NULL, id VARCHAR NOT NULL, param VARCHAR NOT NULL, value DOUBLE,"
        " own_median DOUBLE, fleet_median DOUBLE, detail VARCHAR)",
        # headroom: one row per limit per report (twin/analysis/headroom.py)
        "CREATE TABLE IF NOT EXISTS headroom (computed_at TIMESTAMPTZ NOT NULL,"
        " data_until TIMESTAMPTZ NOT NULL, kind VARCHAR NOT NULL, id VARCHAR NOT NULL,"
        " quantity VARCHAR NOT NULL, unit VARCHAR NOT NULL, limit_value DOUBLE,"
        " value_now DOUBLE, headroom_now DOUBLE, headroom_min_p50 DOUBLE,"
        " headroom_min_p90 DOUBLE, breach_in_s_p50 DOUBLE, breach_in_s_p90 DOUBLE,"
        " rack VARCHAR, cdu VARCHAR, basis VARCHAR)",
    ]
    for kind in KINDS:
        cols = ", ".join(f"{c} {_sql_type(kind, c)}" for c in quantity_columns(kind))
        stmts.append(
            f"CREATE TABLE IF NOT EXISTS {kind} (ts TIMESTAMPTZ NOT NULL, source VARCHAR NOT NULL,"
            f" id VARCHAR NOT NULL, {cols})"
        )
        for res in ROLLUPS:
            agg = ", ".join(
                f"{c}_avg DOUBLE, {c}_min DOUBLE, {c}_max DOUBLE" for c in quantity_columns(kind)
            )
            stmts.append(
                f"CREATE TABLE IF NOT EXISTS {kind}_{res} (bucket TIMESTAMPTZ NOT NULL,"
                f" id VARCHAR NOT NULL, n BIGINT NOT NULL, {agg})"
            )
            # each quantity's own count (``n`` counts rows, a NULL reading's too): the weight
            # of a bucket's mean; stores made before it have NULL there and are weighted by n
            stmts.extend(
                f"ALTER TABLE {kind}_{res} ADD COLUMN IF NOT EXISTS {c}_n BIGINT"
                for c in quantity_columns(kind)
            )
    stmts.extend(ALERT_DDL)
    return stmts


META = {"schema_version": str(SCHEMA_VERSION), "contract_version": str(CONTRACT_VERSION)}

#: Hours exported as Parquet (twin/store/history.py): one row per kind, hour, shard and
#: destination, with the file's size and SHA-256; raw retention deletes only these hours.
HISTORY_DDL: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS history_exports (kind VARCHAR NOT NULL,"
    " hour TIMESTAMPTZ NOT NULL, shard VARCHAR NOT NULL, dest VARCHAR NOT NULL,"
    " rows BIGINT NOT NULL, bytes BIGINT NOT NULL, sha256 VARCHAR NOT NULL,"
    " exported_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (kind, hour, shard, dest))",
)
