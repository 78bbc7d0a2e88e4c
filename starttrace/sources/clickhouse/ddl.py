"""The `otel_traces` table as the OpenTelemetry Collector's `clickhouse` exporter creates it.

Copied from opentelemetry-collector-contrib, exporter/clickhouseexporter/internal/sqltemplates/
traces_table.sql (commit 2bf6b9e1f8c8716ab54eaac1635e56b4d0649900, the template of the 0.15x-0.16x
exporter releases; Apache-2.0), two long ALIAS lines wrapped, its template parts filled the way
the exporter fills them by default: no cluster, `ENGINE = MergeTree()`, no TTL, the bloom-filter
indexes (not the full-text ones). starttrace never creates this table on a server (the Collector
does); tests, benchmarks and
an embedded `chdb:` database use this copy, so the SQL runs against the exporter's own schema.

How the exporter fills it (exporter_traces.go, internal/util.go): Timestamp = span start;
TraceId/SpanId/ParentSpanId lowercase hex ('' for none); ServiceName = resource `service.name`;
ResourceAttributes, SpanAttributes, Events.Attributes, Links.Attributes: every value as
`pcommon.Value.AsString()` (ints and doubles in decimal, bools `true`/`false`, arrays and maps as
JSON); Duration = end - start in ns; StatusCode `Unset|Ok|Error`; SpanKind `Internal|Server|...`.
"""

from __future__ import annotations

EXPORTER_SOURCE = (
    "opentelemetry-collector-contrib exporter/clickhouseexporter/internal/sqltemplates/traces_table.sql"
    " @ 2bf6b9e1f8c8716ab54eaac1635e56b4d0649900"
)
DEFAULT_DATABASE = "otel"  # the exporter's default `database`
DEFAULT_TABLE = "otel_traces"  # the exporter's default `traces_table_name`

_TRACES_TABLE = """CREATE TABLE IF NOT EXISTS {database}.{table} (
    Timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(T64, ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    ResourceAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2),
        CAST(ResourceAttributes, 'Array(Tuple(String, String))')),
    SpanAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2),
        CAST(SpanAttributes, 'Array(Tuple(String, String))')),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1,
    INDEX idx_lower_span_name lower(SpanName) TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"""

# traces_id_ts_lookup_table.sql and traces_id_ts_lookup_mv.sql (same source): min/max Timestamp per trace
_ID_TS_TABLE = """CREATE TABLE IF NOT EXISTS {database}.{table_ts} (
    TraceId String CODEC(ZSTD(1)),
    Start SimpleAggregateFunction(min, DateTime) CODEC(ZSTD(1)),
    End SimpleAggregateFunction(max, DateTime) CODEC(ZSTD(1))
) ENGINE = MergeTree()
PARTITION BY toStartOfWeek(Start)
ORDER BY (TraceId)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"""

_ID_TS_MV = """CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.{table_mv}
TO {database}.{table_ts}
AS SELECT
    TraceId,
    min(Timestamp) as Start,
    max(Timestamp) as End
FROM {database}.{table}
WHERE TraceId != ''
GROUP BY TraceId"""


def traces_ddl(database: str = DEFAULT_DATABASE, table: str = DEFAULT_TABLE) -> list[str]:
    """The exporter's statements (database, traces table, trace-id lookup table and view), in order,
    for plain identifiers (checked by `clickhouse_client.ident`), back-quoted here."""
    names = {
        "database": f"`{database}`",
        "table": f"`{table}`",
        "table_ts": f"`{table}_trace_id_ts`",
        "table_mv": f"`{table}_trace_id_ts_mv`",
    }
    return [
        f"CREATE DATABASE IF NOT EXISTS `{database}`",
        _TRACES_TABLE.format(**names),
        _ID_TS_TABLE.format(**names),
        _ID_TS_MV.format(**names),
    ]
