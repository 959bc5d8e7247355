"""Kafka with TLS and SASL: the ``<Security>`` element, every client of an instance on a broker that demands
them, and secrets that never show (issue: security).

The session's broker has a SASL_SSL listener (SCRAM-SHA-256/512, PLAIN) and an SSL listener that demands a
client certificate; the instance, the HA publisher, ``replication publish`` and a librdkafka consumer use
them."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import pytest
from support.cli import run_cli
from support.fabric import AckListener, publish_orders
from support.factories import wait_until, write_config
from support.secure import KAFKA_PASSWORD, KAFKA_USER, PASSWORD_VARIABLE, sasl_ssl_xml

from replication import config
from replication.client import Publisher
from replication.config import effective
from replication.config.parser import parse_string
from replication.config.security import check_security
from replication.connectors.kafka.security import KafkaSecurity, Secret
from replication.errors import ConfigError, ReplicationError
from replication.instance import Instance


def transport_xml(security: str) -> str:
    return (f"<AMPSConfig><Name>a</Name><Storage>/s</Storage><Transports><Transport><Name>k</Name><Type>kafka</Type>"
            f"<InetAddr>broker:9093</InetAddr><Topic>a.publish</Topic>{security}</Transport></Transports>"
            "</AMPSConfig>")


@pytest.fixture
def ca(tmp_path):
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def test_sasl_ssl_with_the_password_from_the_environment(ca, monkeypatch):
    monkeypatch.setenv(PASSWORD_VARIABLE, KAFKA_PASSWORD)
    cfg = parse_string(transport_xml(sasl_ssl_xml(ca)))
    security = cfg.kafka_transports[0].security
    assert security == KafkaSecurity("SASL_SSL", ca_file=str(ca), sasl_mechanism="SCRAM-SHA-512",
                                     username=KAFKA_USER, password=Secret.from_env(PASSWORD_VARIABLE))
    assert security.password.reveal() == KAFKA_PASSWORD
    assert KAFKA_PASSWORD not in repr(cfg) and KAFKA_PASSWORD not in str(security.password)
    assert security.describe() == f"SASL_SSL, SCRAM-SHA-512 as {KAFKA_USER}"
    # what instance.json holds (upstreams read it): no secret, and it reads back
    written = json.dumps(effective.to_dict(cfg))
    assert KAFKA_PASSWORD not in written and "<secret>" in written
    assert effective.from_dict(json.loads(written)).kafka_transports[0].security.username == KAFKA_USER
    # to the Spark workers as options (Spark redacts keys with "password"), and back
    options = security.to_options()
    assert KafkaSecurity.from_options(options).kafka_python() == security.kafka_python()
    assert [k for k, v in options.items() if v == KAFKA_PASSWORD] == ["kafka.sasl.password"]
    assert pickle.loads(pickle.dumps(security)) == security


def test_a_password_file_and_each_clients_settings(ca, tmp_path):
    secret_file = tmp_path / "kafka-password"
    secret_file.write_text(KAFKA_PASSWORD + "\n")
    security = parse_string(transport_xml(sasl_ssl_xml(ca, mechanism="PLAIN", password_file=secret_file))
                            ).kafka_transports[0].security
    assert security.password.reveal() == KAFKA_PASSWORD
    assert security.kafka_python() == {
        "security_protocol": "SASL_SSL", "ssl_cafile": str(ca), "ssl_check_hostname": True,
        "sasl_mechanism": "PLAIN", "sasl_plain_username": KAFKA_USER, "sasl_plain_password": KAFKA_PASSWORD,
        "reconnect_backoff_max_ms": 1000}
    assert security.librdkafka() == {
        "security.protocol": "sasl_ssl", "ssl.ca.location": str(ca), "sasl.mechanisms": "PLAIN",
        "sasl.username": KAFKA_USER, "sasl.password": KAFKA_PASSWORD}
    assert security.spark_kafka()["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{KAFKA_USER}" password="{KAFKA_PASSWORD}";')


@pytest.mark.parametrize("security, message", [
    ("<Security><Protocol>SASL_SSL</Protocol><SASLMechanism>PLAIN</SASLMechanism><Username>u</Username>"
     f"<Password>{KAFKA_PASSWORD}</Password></Security>", "a password must come from the environment or a file"),
    ("<Security><Protocol>SASL_SSL</Protocol><SASLMechanism>PLAIN</SASLMechanism><Username>u</Username>"
     f"<Password>${{UNSET_VAR:-{KAFKA_PASSWORD}}}</Password></Security>", "(or as a ${VAR:-default})"),
    ("<Security><Protocol>SASL_SSL</Protocol><SASLMechanism>OAUTHBEARER</SASLMechanism></Security>",
     "SASL mechanism OAUTHBEARER is not supported yet: it needs a token provider"),
    ("<Security><Protocol>SASL_SSL</Protocol><SASLMechanism>GSSAPI</SASLMechanism></Security>",
     "SASL mechanism GSSAPI is not supported yet: Kerberos needs a keytab"),
    ("<Security><Protocol>SASL_PLAINTEXT</Protocol><CAFile>ca.pem</CAFile></Security>",
     "<CAFile> is a TLS setting, but <Protocol> is SASL_PLAINTEXT"),
    ("<Security><Protocol>SSL</Protocol><Username>u</Username></Security>",
     "<Username> is a SASL setting, but <Protocol> is SSL"),
    ("<Security><Protocol>SASL_SSL</Protocol><Username>u</Username></Security>", "needs a <SASLMechanism>"),
    ("<Security><Protocol>SASL_SSL</Protocol><SASLMechanism>SCRAM-SHA-256</SASLMechanism><Username>u</Username>"
     "</Security>", "SASL (SCRAM-SHA-256) needs a password"),
    ("<Security><Protocol>TLS</Protocol></Security>", "'TLS' is not a valid Protocol"),
    ("<Security><Protocol>SSL</Protocol><KeyFile>/etc/hostname</KeyFile></Security>",
     "mutual TLS needs both <CertificateFile> and <KeyFile>"),
], ids=["inline password", "password as a default", "OAUTHBEARER", "GSSAPI", "TLS setting without TLS",
        "SASL setting without SASL", "no mechanism", "no password", "bad protocol", "key without certificate"])
def test_a_security_element_that_cannot_work_is_refused_at_load_with_the_fix(security, message):
    with pytest.raises(ConfigError) as info:
        parse_string(transport_xml(security))
    assert message in str(info.value) and "Fix:" in str(info.value), str(info.value)
    assert KAFKA_PASSWORD not in str(info.value)


def test_the_config_loads_without_the_secrets_and_an_instance_start_names_what_is_missing(tmp_path, monkeypatch):
    # `replication status`, `validate` or `replay` in an operator's shell load the config without the secrets
    monkeypatch.delenv(PASSWORD_VARIABLE, raising=False)
    path = write_config(tmp_path, "a", "broker:9093", security=sasl_ssl_xml(tmp_path / "no-ca.pem"))
    transport = config.load(str(path)).kafka_transports[0]
    with pytest.raises(ConfigError) as info:
        check_security(transport)  # what an instance's start and `replication publish` do first
    text = str(info.value)
    assert f"CAFile {tmp_path / 'no-ca.pem'} does not exist" in text and info.value.file == str(path)
    assert f"the environment variable {PASSWORD_VARIABLE} (a Kafka password) is not set" in text
    status = run_cli("status", path)
    assert status.code == 0 and "a " in status.out, status.err


def secure_publisher(fabric, client: str, bootstrap: str, security: KafkaSecurity) -> Publisher:
    name = fabric.name("a")
    pub = Publisher(client, bootstrap=bootstrap, topic=f"{name}.publish", instance=name,
                    store_path=fabric.root / f"{client}.store", security=security)
    fabric.publishers.append(pub)
    return pub


def test_an_instance_on_sasl_ssl_serves_every_client_and_no_secret_shows_anywhere(fabric, broker, monkeypatch,
                                                                                 caplog, capsys):
    caplog.set_level(logging.INFO)
    monkeypatch.setenv(PASSWORD_VARIABLE, KAFKA_PASSWORD)
    name = fabric.name("a")
    path = write_config(fabric.root, name, broker.sasl_ssl_bootstrap, security=sasl_ssl_xml(broker.ca_file))
    fabric.paths["a"] = path
    inst = fabric.start("a")
    security = config.load(str(path)).kafka_transports[0].security

    # the HA publisher over SASL_SSL (SCRAM-SHA-512), another over mutual TLS, a librdkafka consumer of the acks
    certificate, key = broker.issue("mtls-publisher")
    mutual = KafkaSecurity("SSL", ca_file=str(broker.ca_file), certificate_file=str(certificate), key_file=str(key))
    with AckListener("librdkafka", broker.sasl_ssl_bootstrap, f"{name}.acks", security) as acks:
        scram = secure_publisher(fabric, "scram", broker.sasl_ssl_bootstrap, security)
        tls = secure_publisher(fabric, "mtls", broker.mtls_bootstrap, mutual)
        publish_orders(scram, 40)
        publish_orders(tls, 30)
        assert scram.flush(timeout=120) == [] and tls.flush(timeout=120) == []
        published = run_cli("publish", "--config", path, "--client", "cli", "--store", fabric.root / "cli.store",
                            "--topic", "/orders", "--count", 10)
        assert published.code == 0 and "persisted through 10" in published.out, published.out + published.err
        wait_until(lambda: acks.persisted == {"scram": 40, "mtls": 30, "cli": 10}, timeout=60,
                   what="the librdkafka consumer to see every persisted ack")
    assert fabric.count("a") == 80

    status = run_cli("status", path, "--format", "json")
    inst.query.explain(extended=True)  # the ingest query's plans, with its source's options
    outputs = {"log": caplog.text, "publish": published.out + published.err, "status": status.out + status.err,
               "heartbeat": json.dumps(inst.status().to_json(), default=str),
               "progress": json.dumps(inst.query.lastProgress, default=str),
               "explain": capsys.readouterr().out}
    assert "KafkaSourceProvider" in outputs["explain"], outputs["explain"][:2000]  # Spark's own Kafka source
    for what, text in outputs.items():
        assert KAFKA_PASSWORD not in text, f"the password shows in the {what}"
    files = [p for p in fabric.storage("a").rglob("*") if p.is_file()]
    assert any(p.name == "instance.json" for p in files) and len(files) > 20
    leaking = [str(p) for p in files if KAFKA_PASSWORD.encode() in p.read_bytes()]
    assert leaking == [], "files under the instance's storage hold the password"


def mutual_tls_xml(ca_file: Path, certificate: Path, key: Path) -> str:
    return (f"<Security><Protocol>SSL</Protocol><CAFile>{ca_file}</CAFile><CertificateFile>{certificate}"
            f"</CertificateFile><KeyFile>{key}</KeyFile></Security>")


def test_an_instance_reads_its_publishes_over_mutual_tls(fabric, broker):
    """Spark's Kafka client takes the client certificate from a PEM keystore the engine writes: key then chain,
    readable by this user only."""
    name = fabric.name("a")
    certificate, key = broker.issue("mtls-instance")
    path = write_config(fabric.root, name, broker.mtls_bootstrap,
                        security=mutual_tls_xml(broker.ca_file, certificate, key))
    fabric.paths["a"] = path
    fabric.start("a")
    security = config.load(str(path)).kafka_transports[0].security
    keystore = Path(security.spark_kafka()["kafka.ssl.keystore.location"])
    assert keystore.stat().st_mode & 0o777 == 0o600
    assert keystore.read_text() == key.read_text().strip() + "\n" + certificate.read_text().strip() + "\n"
    publisher = secure_publisher(fabric, "mtls", broker.mtls_bootstrap, security)
    publish_orders(publisher, 25)
    assert publisher.flush(timeout=120) == []
    wait_until(lambda: fabric.count("a") == 25, timeout=60, what="the 25 publishes read over mutual TLS")
    assert set(fabric.rows("a", ["seq", "publisher"])["publisher"].to_pylist()) == {"mtls"}


def test_a_key_spark_cannot_read_is_refused_with_the_command_that_converts_it(tmp_path):
    key = tmp_path / "client.key"
    key.write_text("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n")
    certificate = tmp_path / "client.pem"
    certificate.write_text("-----BEGIN CERTIFICATE-----\n")
    security = KafkaSecurity("SSL", certificate_file=str(certificate), key_file=str(key))
    with pytest.raises(ValueError, match=f"KeyFile {key} is not a PKCS#8 key") as info:
        security.spark_kafka()
    assert f"openssl pkcs8 -topk8 -in {key} -out key-pkcs8.pem" in str(info.value)
    with pytest.raises(ValueError, match="is not a PKCS#8 key"):  # at start-up, before any client is made
        security.check()


def test_a_wrong_password_stops_start_up_naming_the_transport_and_not_the_password(spark, broker, tmp_path,
                                                                                    monkeypatch, caplog):
    wrong = "Wrong-2e9d-not-the-password"
    monkeypatch.setenv(PASSWORD_VARIABLE, wrong)
    path = write_config(tmp_path, "refused", broker.sasl_ssl_bootstrap, security=sasl_ssl_xml(broker.ca_file))
    with pytest.raises(ReplicationError) as info:
        Instance(config.load(str(path)), spark).start()
    text = str(info.value)
    assert f"(SASL_SSL, SCRAM-SHA-512 as {KAFKA_USER}) could not be reached or refused this client" in text, text
    assert "<Security>" in text and str(path) in text
    assert wrong not in text + caplog.text


def test_security_file_round_trips_through_generated_configs(tmp_path, monkeypatch):
    from replication.config.security import load_security_file, security_xml

    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    path = tmp_path / "security.xml"
    path.write_text(sasl_ssl_xml(Path("ca.pem")))  # relative: to the file
    security = load_security_file(path)
    assert security.ca_file == str(tmp_path / "ca.pem") and security.password == Secret.from_env(PASSWORD_VARIABLE)
    again = parse_string(transport_xml(security_xml(security))).kafka_transports[0].security
    assert again == security
    assert KAFKA_PASSWORD not in security_xml(security)
    path.write_text("<AMPSConfig/>")
    with pytest.raises(ConfigError, match="the root element is <AMPSConfig>, expected <Security>"):
        load_security_file(path)


def test_benchmarks_reach_a_sasl_ssl_kafka_with_kafka_security(broker, tmp_path, monkeypatch):
    """``--kafka-security``: the benchmarks' producers (in their own processes), their instances' configs and
    their topics reach a broker that demands TLS and SCRAM."""
    import sys
    import uuid

    from kafka import KafkaConsumer, TopicPartition

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import common

    from replication.connectors.kafka.broker import ensure_topics

    path = tmp_path / "security.xml"
    path.write_text(sasl_ssl_xml(broker.ca_file))
    monkeypatch.setenv(PASSWORD_VARIABLE, KAFKA_PASSWORD)
    monkeypatch.setenv(common.SECURITY_FILE_VARIABLE, str(path))
    common.kafka_security.cache_clear()
    try:
        topic = f"bench-secure-{uuid.uuid4().hex[:6]}"
        ensure_topics(broker.sasl_ssl_bootstrap, [topic], security=common.kafka_security())
        common.prepublish(broker.sasl_ssl_bootstrap, topic, common.feeds(300, 2, 1))
        consumer = KafkaConsumer(bootstrap_servers=broker.sasl_ssl_bootstrap, **common.kafka_client_kwargs())
        assert consumer.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)] == 300
        consumer.close()
        cfg = config.load(str(common.write_instance_config(tmp_path, "bench-a", broker.sasl_ssl_bootstrap)))
        assert cfg.kafka_transports[0].security == common.kafka_security()
        assert KAFKA_PASSWORD not in (tmp_path / "bench-a.xml").read_text()
        # the soak's mesh, from copies of conf/mesh/ with the <Security> element
        import soak

        monkeypatch.setenv("REPLICATION_HOME", str(tmp_path))
        monkeypatch.setenv("KAFKA_BOOTSTRAP", broker.sasl_ssl_bootstrap)
        meshed = [config.load(str(soak.mesh_configs(tmp_path) / f"{name}.xml")) for name in soak.ALL]
        assert {m.kafka_transports[0].security for m in meshed if m.kafka_transports} == {common.kafka_security()}
    finally:
        monkeypatch.delenv(common.SECURITY_FILE_VARIABLE)
        common.kafka_security.cache_clear()
