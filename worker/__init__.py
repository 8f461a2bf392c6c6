"""Code that runs inside torchrun ranks and profiling subprocesses (torch; no Prefect, no DuckDB)."""
