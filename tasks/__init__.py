"""Prefect tasks: thin wrappers that call the core, storage or the launcher."""

from launcher.progress import add_log_sink


def _run_log(line: str) -> None:
    """A progress line in the Prefect run log too (the UI), when called inside a flow or task run."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        get_run_logger().info(line)
    except MissingContextError:
        return


add_log_sink(_run_log)
