"""Shared fixtures: one SparkSession per test session, one embedded broker per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from replication.connectors.spark.session import session

    s = session("replication-tests")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def broker():
    """An Apache Kafka broker (KRaft, from jvm/pom.xml's jars) on free loopback ports, for the whole test session."""
    from replication.connectors.kafka.broker import EmbeddedBroker

    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def fabric(spark, broker, tmp_path):
    """Instances in this test session's Spark application, stopped at the end of the test."""
    from fabric_support import TestFabric

    f = TestFabric(spark, broker, tmp_path)
    yield f
    f.close()


@pytest.fixture(params=["driver-read", "spark-job"])
def read_path(request, monkeypatch):
    """An engine test run twice: small micro-batches read by the writers themselves (the default), and
    every micro-batch collected from Spark's DataFrame (what large batches take)."""
    if request.param == "spark-job":
        from replication.connectors.spark import planned_batch

        monkeypatch.setattr(planned_batch, "DRIVER_READ_MAX_ROWS", -1)
    return request.param
