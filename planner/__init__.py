"""meshplan's pure core: specs, GPU catalog, topology, cost model, search, re-planning.

Imports only the standard library, pydantic, numpy, networkx and polars: no I/O, no Prefect,
no DuckDB, no torch (enforced by tests/planner/test_layering.py).
"""
