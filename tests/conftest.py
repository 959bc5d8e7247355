"""Shared fixtures: one SparkSession per test session, one embedded broker per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from replication.spark import session

    s = session("replication-tests")
    yield s
    s.stop()
