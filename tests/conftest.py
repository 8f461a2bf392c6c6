"""Shared test setup: offline, isolated Prefect settings before anything imports prefect."""

import os
import tempfile

_home = tempfile.mkdtemp(prefix="meshplan-test-prefect-")
os.environ.setdefault("PREFECT_HOME", _home)
os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", os.path.join(_home, "storage"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.pop("PREFECT_API_URL", None)
