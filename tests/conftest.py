"""Shared fixtures: one SparkSession per test session, one embedded broker per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from replication.spark import session

    s = session("replication-tests")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def broker():
    """A tansu broker (memory storage) on a free loopback port, for the whole test session."""
    from replication.broker import EmbeddedBroker

    with EmbeddedBroker() as b:
        yield b
