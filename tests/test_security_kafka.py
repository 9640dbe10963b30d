"""A real broker that speaks only TLS: one listener wants a client certificate signed by the
test's CA, another wants SASL OAUTHBEARER (Kafka's unsecured JWT validator) over TLS. vigil's
settings reach it both ways: librdkafka (CLI, ticker, admin) and aiokafka with Faust's
credentials (the worker), the worker's tokens from the local token endpoint, librdkafka's own.

The broker is a second single-node KRaft Kafka from the local stack's download, started for
this module only (about 10-20 s) and stopped at its end."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from streams.kafka.security import ClientCredentialsTokenProvider, broker_credentials
from streams.local import stack as localstack
from streams.settings import Settings
from tests.test_security import Pki, TokenEndpoint

pytestmark = pytest.mark.kafka
START_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TlsBroker:
    ssl: str  # bootstrap of the mTLS listener
    sasl_ssl: str  # bootstrap of the OAUTHBEARER-over-TLS listener
    pki: Pki
    idp: TokenEndpoint


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    root = tmp_path_factory.mktemp("tls-broker")
    pki = Pki(root)
    keystore = root / "server-keystore.pem"
    keystore.write_text(Path(pki.server_key).read_text() + Path(pki.server_cert).read_text())
    ssl_port, sasl_port, internal, controller = (_free_port() for _ in range(4))
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "listeners": f"SSL://127.0.0.1:{ssl_port},SASL_SSL://127.0.0.1:{sasl_port},"
        f"INTERNAL://127.0.0.1:{internal},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"SSL://127.0.0.1:{ssl_port},SASL_SSL://127.0.0.1:{sasl_port},"
        f"INTERNAL://127.0.0.1:{internal}",
        "listener.security.protocol.map": "SSL:SSL,SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,"
        "CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": pki.ca,
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="broker";'
        ),
        "log.dirs": str(root / "data"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    server = root / "server.properties"
    server.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    stack = localstack.Settings.from_env()
    localstack._fetch_kafka(stack)  # already there once the session's cluster ran locally
    java = str(localstack.find_java())
    classpath = str(stack.kafka_home / "libs" / "*")
    subprocess.run(
        [
            java,
            "-Xmx256m",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={uuid.uuid4().hex[:22]}",
            "-c",
            str(server),
        ],
        capture_output=True,
        check=True,
        timeout=120,
    )
    log = (root / "kafka.log").open("wb")
    proc = subprocess.Popen(
        [java, "-Xmx384m", "-Xms128m", "-cp", classpath, "kafka.Kafka", str(server)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    idp = TokenEndpoint("vigil-worker", "oauth-secret")
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        # ready when the plaintext inter-broker listener answers a metadata request
        while not localstack.kafka_answers(f"127.0.0.1:{internal}", timeout=2.0):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (root / "kafka.log").read_text()[-3000:]
                pytest.fail(f"TLS broker did not start:\n{tail}")
            time.sleep(0.5)
        yield TlsBroker(f"127.0.0.1:{ssl_port}", f"127.0.0.1:{sasl_port}", pki, idp)
    finally:
        idp.close()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def mtls(broker: TlsBroker) -> Settings:
    p = broker.pki
    return Settings(
        bootstrap_servers=broker.ssl,
        security_protocol="SSL",
        ssl_ca_file=p.ca,
        ssl_cert_file=p.client_cert,
        ssl_key_file=p.client_key,
        ssl_key_password=p.key_password,
    )


def oauth(broker: TlsBroker) -> Settings:
    return Settings(
        bootstrap_servers=broker.sasl_ssl,
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        oauth_token_url=broker.idp.url,
        oauth_client_id="vigil-worker",
        oauth_client_secret="oauth-secret",
        ssl_ca_file=broker.pki.ca,
    )


def _librdkafka_round_trip(settings: Settings, topic: str) -> bytes:
    """Create ``topic`` (admin), write a record (producer), read it back (consumer)."""
    conf = settings.confluent_conf()
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(conf)
    producer.produce(topic, b"over tls")
    assert producer.flush(30) == 0
    consumer = Consumer(conf | {"group.id": topic, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                return bytes(msg.value())
        raise AssertionError("no record read back")
    finally:
        consumer.close()


async def _aiokafka_round_trip(settings: Settings, topic: str) -> bytes:
    """What the worker's clients do, with the auth Faust hands aiokafka."""
    auth = credentials_to_aiokafka_auth(broker_credentials(settings))
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, **auth)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"worker over tls")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=settings.bootstrap_servers, auto_offset_reset="earliest", **auth
    )
    await consumer.start()
    try:
        async with asyncio.timeout(30):
            async for msg in consumer:
                if msg.value == b"worker over tls":
                    return msg.value
    finally:
        await consumer.stop()
    raise AssertionError("unreachable")


def test_client_certificate_listener(broker: TlsBroker) -> None:
    s = mtls(broker)
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    assert _librdkafka_round_trip(s, topic) == b"over tls"
    assert asyncio.run(_aiokafka_round_trip(s, topic)) == b"worker over tls"
    # the listener really wants the certificate: without it no client gets metadata
    bare = replace(s, ssl_cert_file=None, ssl_key_file=None, ssl_key_password=None)
    with pytest.raises(KafkaException):
        AdminClient(bare.confluent_conf()).list_topics(timeout=5)


def test_oauthbearer_listener(broker: TlsBroker) -> None:
    s = oauth(broker)
    topic = f"oauth-{uuid.uuid4().hex[:8]}"
    before = len(broker.idp.requests)
    assert _librdkafka_round_trip(s, topic) == b"over tls"  # librdkafka's own OIDC fetch
    fetched_by_librdkafka = len(broker.idp.requests) - before
    assert fetched_by_librdkafka >= 1
    assert asyncio.run(_aiokafka_round_trip(s, topic)) == b"worker over tls"
    worker_fetches = len(broker.idp.requests) - before - fetched_by_librdkafka
    # the worker's producer and consumer each made a provider: one token each, however many
    # connections (bootstrap, partition leader, coordinator) each authenticated
    assert 1 <= worker_fetches <= 2
    assert isinstance(
        credentials_to_aiokafka_auth(broker_credentials(s))["sasl_oauth_token_provider"],
        ClientCredentialsTokenProvider,
    )
