"""meshplan's pure core: specs, GPU catalog, topology, cost model, search, re-planning.

Imports only the standard library, pydantic, numpy, networkx and polars: no I/O, no Prefect,
no DuckDB, no torch (import-linter contracts in pyproject.toml, run by tests/test_architecture.py).
"""
