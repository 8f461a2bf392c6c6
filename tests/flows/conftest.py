"""Real Prefect flow runs against a temporary local server (prefect_test_harness), offline."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def prefect_harness(tmp_path_factory):
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    storage = tmp_path_factory.mktemp("prefect-storage")
    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: storage}):
        with prefect_test_harness(server_startup_timeout=120):
            yield
