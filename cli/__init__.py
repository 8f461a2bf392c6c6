"""The `meshplan` command line: typer commands that parse, call flows (or the functions flows/
exposes) and print. It imports no storage, tasks, worker, torch or DuckDB (pyproject's contracts)."""
