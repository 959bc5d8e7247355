"""Shared fixtures (one SparkSession, one broker, one S3 server, a fabric of instances per test) and the ``e2e`` marker.

``pytest_collection_modifyitems`` marks ``e2e`` every test whose fixtures include the services."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_instance_process_outlives_its_test():
    """A test that failed before stopping its instance processes (``support.processes``) leaves them running in
    sessions of their own: they are killed here, so that they do not slow every later test."""
    yield
    import warnings

    from support.processes import kill_leftovers

    if left := kill_leftovers():
        warnings.warn(f"{left} instance process(es) this test left running were killed", stacklevel=1)


@pytest.fixture(scope="session")
def spark():
    from replication.connectors.spark.session import session

    s = session("replication-tests")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def broker():
    """An Apache Kafka broker (KRaft, from jvm/pom.xml's jars) on free loopback ports, for the whole test session:
    plain text, and SASL_SSL and mutual-TLS listeners for the security tests (``support.secure``)."""
    from support.secure import KAFKA_PASSWORD, KAFKA_USER

    from replication.connectors.kafka.broker import EmbeddedBroker

    with EmbeddedBroker(users={KAFKA_USER: KAFKA_PASSWORD}) as b:
        yield b


@pytest.fixture(scope="session")
def s3():
    """A local S3-compatible server (:mod:`replication.connectors.s3.server`) for the whole test session."""
    from replication.connectors.s3.server import LocalS3Server

    with LocalS3Server() as server:
        yield server


@pytest.fixture
def s3_process(s3, monkeypatch):
    """The session's S3 server as this process's S3 settings (the standard AWS variables) for one test; the
    settings the process cached are dropped before and after, so no other test sees them."""
    from replication.connectors.s3.access import environment_access, environment_filesystem

    for name, value in s3.environment().items():
        monkeypatch.setenv(name, value)
    environment_access.cache_clear()
    environment_filesystem.cache_clear()
    yield s3
    environment_access.cache_clear()
    environment_filesystem.cache_clear()


@pytest.fixture
def fabric(spark, broker, tmp_path):
    """Instances in this test session's Spark application, stopped at the end of the test."""
    from support.fabric import TestFabric

    f = TestFabric(spark, broker, tmp_path)
    yield f
    f.close()


@pytest.fixture(params=["driver-read", "spark-job"])
def read_path(request, monkeypatch):
    """An engine test run twice: the ingest's small micro-batches read by its writer itself (the default), and
    every micro-batch collected from Spark's DataFrame (what large batches take)."""
    if request.param == "spark-job":
        from replication.connectors.spark import planned_batch

        monkeypatch.setattr(planned_batch, "DRIVER_READ_MAX_ROWS", -1)
    return request.param


#: The fixtures that start services: a test using any of them, directly or through another fixture, is ``e2e``.
SERVICE_FIXTURES = frozenset({"spark", "broker", "fabric", "s3"})


def pytest_collection_modifyitems(config, items):
    """Mark ``e2e`` every test that needs services: one whose fixtures (with those they use) include
    ``spark``, ``broker``, ``fabric`` or ``s3``. Tests that start instance or CLI processes of their own are marked
    ``e2e`` in their modules; ``-m "not slow and not e2e"`` then runs the pure-logic tests alone."""
    for item in items:
        if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    # the linters first: a lint finding is reported in seconds, not after the end-to-end tests
    items.sort(key=lambda item: item.path.name != "test_lint.py")
