"""TLS and SASL settings reach every client: librdkafka's keys (CLI, ticker, admin), Faust's
credentials (worker, on aiokafka) and the schema-registry client; the worker's OAuth token
provider against a real local token endpoint, librdkafka's own OIDC fetch against the same, and
the registry client against a local https server that wants a client certificate."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from streams.kafka.security import (
    ClientCredentialsTokenProvider,
    TokenError,
    broker_credentials,
    kafka_ssl_context,
)
from streams.settings import Settings

# --- a CA, a server certificate for 127.0.0.1 and a client certificate, made per test ---------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.now(UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    else:
        b = b.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    if server:
        import ipaddress

        b = b.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
    elif not ca:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
    return b.sign(issuer_key, hashes.SHA256())


class Pki:
    def __init__(self, root: Path) -> None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("vigil test CA", ca_key, "vigil test CA", ca_key, ca=True)
        self.ca = self._write(root / "ca.pem", ca)
        self.server_cert, self.server_key = self._leaf(root, "server", ca_key, server=True)
        self.client_cert, self.client_key = self._leaf(
            root, "client", ca_key, password=b"key-secret"
        )
        self.key_password = "key-secret"

    @staticmethod
    def _write(path: Path, cert: x509.Certificate) -> str:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return str(path)

    def _leaf(
        self,
        root: Path,
        cn: str,
        ca_key: ec.EllipticCurvePrivateKey,
        *,
        server: bool = False,
        password: bytes | None = None,
    ) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(cn, key, "vigil test CA", ca_key, server=server)
        crypt = (
            serialization.BestAvailableEncryption(password)
            if password
            else serialization.NoEncryption()
        )
        (root / f"{cn}.key").write_bytes(
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, crypt)
        )
        return self._write(root / f"{cn}.pem", cert), str(root / f"{cn}.key")


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


# --- a tiny OAuth 2 token endpoint -------------------------------------------------------------


class TokenEndpoint:
    """Answers client-credentials requests for one client with numbered tokens."""

    def __init__(self, client_id: str, secret: str, expires_in: int | None = 3600) -> None:
        self.requests: list[dict[str, Any]] = []
        self.expires_in = expires_in
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                auth = self.headers.get("Authorization", "")
                endpoint.requests.append({"form": form, "auth": auth})
                expected = "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()
                if auth != expected or form.get("grant_type") != "client_credentials":
                    self._answer(401, {"error": "invalid_client"})
                    return
                body: dict[str, Any] = {
                    "access_token": _jwt(f"token-{len(endpoint.requests)}", client_id),
                    "token_type": "Bearer",
                }
                if endpoint.expires_in is not None:
                    body["expires_in"] = endpoint.expires_in
                self._answer(200, body)

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _jwt(jti: str, subject: str) -> str:
    """An unsecured JWT (``alg: none``, no signature) with the claims librdkafka reads and
    Kafka's unsecured validator wants (``sub``, ``iat``, ``exp``)."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    now = int(datetime.now(UTC).timestamp())
    claims = {"sub": subject, "iat": now, "exp": now + 3600, "jti": jti}
    return f"{part({'alg': 'none'})}.{part(claims)}."


@pytest.fixture
def idp() -> Iterator[TokenEndpoint]:
    endpoint = TokenEndpoint("vigil-worker", "oauth-secret")
    yield endpoint
    endpoint.close()


def oauth_settings(url: str, **kw: Any) -> Settings:
    return Settings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="OAUTHBEARER",
        oauth_token_url=url,
        oauth_client_id="vigil-worker",
        oauth_client_secret="oauth-secret",
        oauth_scope="kafka",
        **kw,
    )


# --- librdkafka: CLI, ticker, admin ------------------------------------------------------------


def test_confluent_conf_carries_the_ca_the_client_certificate_and_its_key(pki: Pki) -> None:
    s = Settings(
        security_protocol="SSL",
        ssl_ca_file=pki.ca,
        ssl_cert_file=pki.client_cert,
        ssl_key_file=pki.client_key,
        ssl_key_password=pki.key_password,
    )
    conf = s.confluent_conf()
    assert conf == {
        "bootstrap.servers": s.bootstrap_servers,
        "security.protocol": "SSL",
        "ssl.ca.location": pki.ca,
        "ssl.certificate.location": pki.client_cert,
        "ssl.key.location": pki.client_key,
        "ssl.key.password": "key-secret",
    }
    # librdkafka loads the files when the client is made: a wrong key password is refused
    Producer(conf).flush(0)
    with pytest.raises(Exception, match=r"(?i)key"):
        Producer(conf | {"ssl.key.password": "wrong"})


def test_confluent_conf_for_scram() -> None:
    s = Settings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="vigil",
        sasl_password="pw",
    )
    assert s.confluent_conf() == {
        "bootstrap.servers": s.bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "vigil",
        "sasl.password": "pw",
    }


def test_librdkafka_fetches_its_oauth_token_from_the_endpoint(idp: TokenEndpoint) -> None:
    """The OIDC keys are librdkafka's own: a client made from them asks the token endpoint with
    the client's id and secret and the scope, before it reaches any broker."""
    conf = oauth_settings(idp.url, bootstrap_servers="127.0.0.1:9").confluent_conf()
    assert conf["sasl.oauthbearer.method"] == "oidc"
    producer = Producer(conf)
    for _ in range(50):
        producer.poll(0.1)
        if idp.requests:
            break
    assert idp.requests, "librdkafka never asked the token endpoint"
    first = idp.requests[0]
    assert first["form"]["grant_type"] == "client_credentials"
    assert first["form"]["scope"] == "kafka"
    assert first["auth"] == "Basic " + base64.b64encode(b"vigil-worker:oauth-secret").decode()


# --- Faust / aiokafka: the worker --------------------------------------------------------------


def test_worker_tls_context_trusts_the_ca_and_presents_the_client_certificate(pki: Pki) -> None:
    s = Settings(
        security_protocol="SSL",
        ssl_ca_file=pki.ca,
        ssl_cert_file=pki.client_cert,
        ssl_key_file=pki.client_key,
        ssl_key_password=pki.key_password,
    )
    auth = credentials_to_aiokafka_auth(broker_credentials(s))
    assert auth["security_protocol"] == "SSL"
    ctx = auth["ssl_context"]
    assert [dict(c["subject"][0])["commonName"] for c in ctx.get_ca_certs()] == ["vigil test CA"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_worker_without_tls_has_no_credentials() -> None:
    assert broker_credentials(Settings()) is None
    assert kafka_ssl_context(Settings()) is None


@pytest.mark.parametrize(("protocol", "tls"), [("SASL_SSL", True), ("SASL_PLAINTEXT", False)])
def test_worker_sasl_plain_and_scram(protocol: str, tls: bool) -> None:
    s = Settings(
        security_protocol=protocol,
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="vigil",
        sasl_password="pw",
    )
    auth = credentials_to_aiokafka_auth(broker_credentials(s))
    assert auth["security_protocol"] == protocol
    assert auth["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (auth["sasl_plain_username"], auth["sasl_plain_password"]) == ("vigil", "pw")
    assert (auth["ssl_context"] is not None) == tls


def test_worker_oauthbearer_gets_tokens_from_the_endpoint(idp: TokenEndpoint, pki: Pki) -> None:
    s = oauth_settings(idp.url)
    s = Settings(**{**s.__dict__, "security_protocol": "SASL_SSL", "ssl_ca_file": pki.ca})
    auth = credentials_to_aiokafka_auth(broker_credentials(s))
    assert (auth["security_protocol"], auth["sasl_mechanism"]) == ("SASL_SSL", "OAUTHBEARER")
    provider = auth["sasl_oauth_token_provider"]
    assert isinstance(provider, ClientCredentialsTokenProvider)
    assert "oauth-secret" not in repr(provider)
    token = asyncio.run(provider.token())
    assert token.count(".") == 2 and token.endswith(".")
    assert idp.requests[0]["form"] == {"grant_type": "client_credentials", "scope": "kafka"}


# --- the token provider ------------------------------------------------------------------------


def test_a_token_is_kept_until_most_of_its_lifetime_is_spent(idp: TokenEndpoint) -> None:
    now = [0.0]
    p = ClientCredentialsTokenProvider(
        idp.url, "vigil-worker", "oauth-secret", clock=lambda: now[0]
    )

    async def scenario() -> list[str]:
        first = await asyncio.gather(*(p.token() for _ in range(5)))  # connections at once
        now[0] = 0.79 * 3600
        kept = await p.token()
        now[0] = 0.81 * 3600
        renewed = await p.token()
        return [*first, kept, renewed]

    tokens = asyncio.run(scenario())
    assert len(set(tokens[:6])) == 1
    assert tokens[6] != tokens[0]
    assert p.fetched == len(idp.requests) == 2


def test_a_token_without_expires_in_is_fetched_again_after_a_minute(idp: TokenEndpoint) -> None:
    idp.expires_in = None
    now = [0.0]
    p = ClientCredentialsTokenProvider(
        idp.url, "vigil-worker", "oauth-secret", clock=lambda: now[0]
    )

    async def scenario() -> None:
        await p.token()
        now[0] = 47.0
        await p.token()
        now[0] = 49.0
        await p.token()

    asyncio.run(scenario())
    assert p.fetched == 2


def test_a_refused_client_gets_an_error_naming_the_endpoint_not_the_secret(
    idp: TokenEndpoint,
) -> None:
    p = ClientCredentialsTokenProvider(idp.url, "vigil-worker", "wrong-secret")
    with pytest.raises(TokenError) as info:
        asyncio.run(p.token())
    assert (
        str(info.value) == f"token endpoint {idp.url} answered 401 without a token: invalid_client"
    )
    assert "wrong-secret" not in str(info.value)


def test_an_unreachable_endpoint_is_a_token_error() -> None:
    p = ClientCredentialsTokenProvider("http://127.0.0.1:9/token", "a", "b", timeout=2)
    with pytest.raises(TokenError, match=r"token endpoint http://127.0.0.1:9/token unreachable"):
        asyncio.run(p.token())


# --- the schema-registry client over TLS -------------------------------------------------------


@pytest.fixture
def https_registry(pki: Pki) -> Iterator[str]:
    """An https server that wants a client certificate signed by the CA and answers
    ``GET /subjects`` like a registry."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = json.dumps(["vigil.ok-value"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.load_verify_locations(pki.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_registry_client_trusts_the_ca_and_presents_its_certificate(
    pki: Pki, https_registry: str, tmp_path: Path
) -> None:
    plain_key = tmp_path / "client-plain.key"
    key = serialization.load_pem_private_key(Path(pki.client_key).read_bytes(), b"key-secret")
    plain_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    s = Settings(
        schema_registry_url=https_registry,
        registry_ssl_ca_file=pki.ca,
        registry_ssl_cert_file=pki.client_cert,
        registry_ssl_key_file=str(plain_key),
    )
    conf = s.registry_config().client_conf()
    assert conf["ssl.ca.location"] == pki.ca
    assert SchemaRegistryClient(conf).get_subjects() == ["vigil.ok-value"]
    # without the CA the server is not trusted; without the certificate it refuses the client
    for missing in ("ssl.ca.location", "ssl.certificate.location"):
        partial = {k: v for k, v in conf.items() if k not in (missing, "ssl.key.location")}
        if missing == "ssl.ca.location":
            partial |= {k: conf[k] for k in ("ssl.certificate.location", "ssl.key.location")}
        with pytest.raises(Exception):  # noqa: B017 - httpx's TLS error, whatever its class
            SchemaRegistryClient(partial | {"max.retries": 0}).get_subjects()
