"""Options and helpers every ``vigil`` command module shares: the connection flags, and the
settings and codec they make. Their own module, so that command modules and the CLI's entry
point (``streams/cli/main.py``, which mounts them) do not import each other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from streams.settings import Settings

if TYPE_CHECKING:
    from streams.contracts.codec import AvroCodec

BootstrapOpt = Annotated[
    str | None,
    typer.Option(
        "--bootstrap",
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        help="Kafka bootstrap servers [default: 127.0.0.1:19092, the dev broker].",
    ),
]
RegistryOpt = Annotated[
    str | None,
    typer.Option(
        "--registry",
        envvar="SCHEMA_REGISTRY_URL",
        help="Schema registry URL (Confluent API) [default: the dev registry].",
    ),
]


def settings_from_flags(
    bootstrap: str | None = None, registry: str | None = None, **kw: Any
) -> Settings:
    return Settings.from_env(bootstrap_servers=bootstrap, schema_registry_url=registry, **kw)


def codec_for(settings: Settings) -> AvroCodec:
    from streams.contracts.codec import AvroCodec

    return AvroCodec.connect(
        settings.registry_config(),
        auto_register=settings.auto_register,
    )
