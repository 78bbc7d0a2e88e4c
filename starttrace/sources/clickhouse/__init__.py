"""Everything ClickHouse, in one place (docs/fleet.md):

- `client`: the URL (`http(s)://...` or `chdb:PATH`), one small client over both engines, typed parameters;
- `ddl`: the Collector exporter's `otel_traces` table (tests, benchmarks, embedded databases);
- `runs`: runs read from `otel_traces` (listing, loading at full detail);
- `facts`: per-run fleet facts beside the traces table, and the `starttrace.run` spans the exporters ship;
- `store`: what the service asks of its store, answered from `otel_traces` (`serve --clickhouse`).
"""
