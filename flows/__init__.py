"""Prefect flows (one stage per module, plus the whole pipeline) and the `meshplan` CLI."""
