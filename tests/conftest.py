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


@pytest.fixture
def fabric(spark, broker, tmp_path):
    """Instances in this test session's Spark application, stopped at the end of the test."""
    from fabric_support import TestFabric

    f = TestFabric(spark, broker, tmp_path)
    yield f
    f.close()
