"""Where a trace store keeps its rows: an SQLite file (the default, no server) or a PostgreSQL database
(a store several processes and hosts share). Both take the same SQL (written for SQLite; the PostgreSQL
backend translates its few differences), the same schema version and the same migrations."""
