"""DuckDB storage: the only package that talks to the database file.

Connections are opened for the few milliseconds a read or write takes (a DuckDB 2 connection locks
the file against every other process) and a locked file is retried with backoff. Writes are
idempotent upserts on natural keys inside one transaction, so a retried or killed task never
duplicates or half-writes rows. Reads return polars frames or planner specs.
"""
