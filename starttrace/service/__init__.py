"""The starttrace service: OTLP/HTTP receiver, journal watcher, SQLite store, API and web page."""
