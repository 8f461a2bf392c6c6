"""Prefect tasks: thin wrappers that call the core, storage or a worker."""
