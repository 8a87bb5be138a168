"""The test suite. Imported before its conftest and before Prefect: a setting made here is Prefect's from the start."""

import os

if os.environ.get("PREFECT_WEBHOOKS_TEST_INTERPRETER_CHECK"):
    # CI's extra Python versions run without the Prefect test server (tests/conftest.py), so no API URL is set. For
    # a process's first event Prefect would then start a temporary server of its own, whatever the ephemeral-mode
    # setting (an endpoint event a delivery test causes), and one outlived the session (CI, 2026-11-29: the run
    # failed). With an API key and no URL, Prefect's ``should_emit_events`` is false: events go nowhere, and no
    # other Prefect call of these tests reads the key.
    os.environ.setdefault("PREFECT_API_KEY", "no-events-without-the-test-server")
