"""`meshplan ui`: a local Prefect server (127.0.0.1) that shows every meshplan run, plan and report."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.app import app, load_settings, prefect_env


@app.command()
def ui(
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="port (default ui.port = 4200)")] = None,
    host: Annotated[str | None, typer.Option(help="interface to bind (default 127.0.0.1: this machine only)")] = None,
) -> None:
    """Start the Prefect UI for this state folder; meshplan commands run meanwhile report to it."""
    import time

    from flows.server import start_server, stop_server

    cfg = load_settings([f"ui.port={port}"] if port else [])
    prefect_env(cfg)
    h = host or cfg.ui.host
    proc = start_server(cfg.state.dir, h, cfg.ui.port)
    print(f"Prefect UI: http://{h}:{cfg.ui.port}  (API http://{h}:{cfg.ui.port}/api) — Ctrl-C stops it")
    try:
        while proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stop_server(proc, cfg.state.dir)
    if proc.returncode not in (0, -15, None):
        raise typer.Exit(1)
