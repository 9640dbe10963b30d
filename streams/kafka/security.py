"""TLS and SASL for the worker's Kafka clients (Faust on aiokafka).

The confluent-kafka clients (CLI, ticker, admin) get the same settings as librdkafka keys
(``Settings.confluent_conf``), and librdkafka fetches OAuth tokens itself. aiokafka only asks a
token provider for a token whenever it authenticates a connection, so the worker brings its own:
``ClientCredentialsTokenProvider`` (OAuth 2 client credentials grant, RFC 6749 §4.4), which keeps
a token until most of its lifetime is spent, so reconnecting brokers do not each cost a request.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Any

import httpx
from aiokafka.abc import AbstractTokenProvider

from streams.settings import Settings

#: share of a token's lifetime after which the next ``token()`` fetches a new one
REFRESH_AT = 0.8
#: lifetime assumed for a token whose answer gives no ``expires_in``
DEFAULT_LIFETIME_S = 60.0


class TokenError(RuntimeError):
    """The token endpoint gave no token; the message names it and never the secret."""


class ClientCredentialsTokenProvider(AbstractTokenProvider):
    """Access tokens from an OAuth 2 token endpoint, by client id and secret (HTTP Basic, as
    RFC 6749 §2.3.1 asks endpoints to accept), cached until ``REFRESH_AT`` of their lifetime."""

    def __init__(
        self,
        url: str,
        client_id: str,
        client_secret: str,
        scope: str | None = None,
        *,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.scope = scope
        self._auth = (client_id, client_secret)
        self._timeout = timeout
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = asyncio.Lock()
        #: tokens fetched so far (what the cache saved is visible in tests and logs)
        self.fetched = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} client={self._auth[0]}>"

    async def token(self) -> str:
        async with self._lock:  # connections authenticating together share one request
            now = self._clock()
            if self._token is None or now >= self._refresh_at:
                self._token, lifetime = await self._fetch()
                self._refresh_at = now + lifetime * REFRESH_AT
            return self._token

    async def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials"}
        if self.scope:
            form["scope"] = self.scope
        try:
            async with httpx.AsyncClient(timeout=self._timeout) as client:
                resp = await client.post(self.url, data=form, auth=self._auth)
        except httpx.HTTPError as exc:
            raise TokenError(f"token endpoint {self.url} unreachable: {exc}") from exc
        try:
            body: Any = resp.json()
        except ValueError:
            body = {}
        if resp.status_code != 200 or not isinstance(body, dict) or "access_token" not in body:
            detail = body.get("error_description") or body.get("error") if body else None
            raise TokenError(
                f"token endpoint {self.url} answered {resp.status_code} without a token"
                + (f": {detail}" if detail else "")
            )
        self.fetched += 1
        lifetime = body.get("expires_in")
        try:
            seconds = float(lifetime) if lifetime is not None else DEFAULT_LIFETIME_S
        except (TypeError, ValueError):
            seconds = DEFAULT_LIFETIME_S
        return str(body["access_token"]), max(seconds, 0.0)


def kafka_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of the worker's broker connections (None without TLS): the system's
    trust store or ``KAFKA_SSL_CA_FILE``, and the client certificate when one is set."""
    if not settings.security_protocol.endswith("SSL"):
        return None
    ctx = ssl.create_default_context(cafile=settings.ssl_ca_file)
    if settings.ssl_cert_file:
        ctx.load_cert_chain(
            settings.ssl_cert_file, settings.ssl_key_file, password=settings.ssl_key_password
        )
    return ctx


def token_provider(settings: Settings) -> ClientCredentialsTokenProvider:
    assert settings.oauth_token_url and settings.oauth_client_id and settings.oauth_client_secret
    return ClientCredentialsTokenProvider(
        settings.oauth_token_url,
        settings.oauth_client_id,
        settings.oauth_client_secret,
        settings.oauth_scope,
    )


def broker_credentials(settings: Settings) -> Any:
    """Faust's ``broker_credentials`` for the settings (None: plaintext, no SASL)."""
    import faust

    ctx = kafka_ssl_context(settings)
    if settings.sasl_mechanism == "OAUTHBEARER":
        return faust.OAuthCredentials(oauth_cb=token_provider(settings), ssl_context=ctx)
    if settings.sasl_mechanism:
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password or "",
            mechanism=settings.sasl_mechanism,
            ssl_context=ctx,
        )
    if ctx is not None:
        return faust.SSLCredentials(ctx)
    return None
