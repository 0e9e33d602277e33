"""Fixtures for the serving tests: a watchdog, and no runner process may outlive a test or module (R1)."""
from __future__ import annotations

import pytest


@pytest.fixture
def bounded_and_clean():
    """A test that starts runner processes: a watchdog, and no runner may survive it (R1)."""
    import faulthandler

    from tests.support.processes import runner_processes

    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
    left = runner_processes()
    for p in left:
        p.kill()
    assert not left, f"runner processes survived the test: {left}"


@pytest.fixture
def watchdog():
    """A test that talks to runner processes: a stack dump and exit if it hangs for 120 s."""
    import faulthandler

    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def no_runner_left():
    """A module whose server starts runner processes: none may survive the module (R1)."""
    from tests.support.processes import runner_processes

    yield
    left = runner_processes()
    for p in left:
        p.kill()
    assert not left, f"runner processes survived the module: {left}"
