"""`starttrace serve`: run the service with uvicorn."""

from __future__ import annotations

import os
from pathlib import Path

from starttrace.service.app import Settings, create_app, parse_retention


def serve(
    host: str = "127.0.0.1",
    port: int = 4318,
    db: str | Path | None = None,
    journal_dir: str | Path | None = None,
    token: str | None = None,
    retention: str | float | None = None,
    decode_workers: int = 1,
) -> None:
    """Serve the OTLP receiver, the API and the web page until interrupted.

    `db`: SQLite file (default `$XDG_STATE_HOME/starttrace/starttrace.db`); `journal_dir`: a journal
    root (`ROOT/<run_id>/<journals>`) to watch; `token`: bearer token required on every endpoint but
    /healthz (default: `$STARTTRACE_TOKEN`); `retention`: drop runs older than this ('7d', '12h');
    `decode_workers`: processes decoding OTLP bodies (`service/decoder.py`; 0: in the service).
    """
    import uvicorn

    if token is None:
        token = os.environ.get("STARTTRACE_TOKEN") or None
    settings = Settings(
        db=db,
        journal_dir=journal_dir,
        token=token,
        retention_s=parse_retention(retention),
        decode_workers=decode_workers,
    )
    app = create_app(settings)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on")


def main(argv: list[str] | None = None) -> None:
    """`python -m starttrace.service.server` (tests and benchmarks; the CLI calls `serve`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="starttrace-serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument("--db")
    parser.add_argument("--journal-dir")
    parser.add_argument("--token")
    parser.add_argument("--retention")
    parser.add_argument("--decode-workers", type=int, default=1)
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.db, args.journal_dir, args.token, args.retention, args.decode_workers)


if __name__ == "__main__":
    main()
