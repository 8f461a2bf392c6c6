"""`meshplan`: entry point. Loads command modules and turns user mistakes into one-line errors."""

from __future__ import annotations

import signal
import sys

from flows.app import app

# each module registers its commands on `app` when imported; none imports anything heavy at top level
from flows.commands import (  # noqa: F401
    compare,
    discover,
    export,
    inspect,
    jobs,
    plan,
    profile,
    replan,
    run,
    serve,
    simulate,
    train,
    ui,
)


def main() -> None:
    # SIGTERM must unwind normally so an ephemeral Prefect server child is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        app()
    except Exception as exc:  # user mistakes: one line, exit 1; anything else is a bug and keeps its traceback
        if _is_user_error(exc):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(1)
        raise


def _is_user_error(exc: BaseException) -> bool:
    from planner.errors import MeshplanError

    if isinstance(exc, MeshplanError | FileNotFoundError | PermissionError | IsADirectoryError):
        return True
    return type(exc).__name__ in {"StoreLockedError", "UserError"}


if __name__ == "__main__":
    main()
