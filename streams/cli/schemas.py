"""``vigil schemas``: register vigil's schemas on the registry, and check a changed ``.avsc``
before it is deployed.

``check`` tests each file the way the build plugins of the Kafka ecosystem do before a
deploy: against what the registry holds under the file's subjects (every version, as
BACKWARD_TRANSITIVE wants), and against every earlier version of the file in git history,
where the new schema, as the reader, must resolve each old one as the writer
(``streams.contracts.compat``).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from streams.contracts.models.base import SCHEMA_DIR
from streams.settings import Settings

schemas_app = typer.Typer(
    help="Register vigil's schemas on the registry and check changed ones.",
    no_args_is_help=True,
)
out = Console()
err = Console(stderr=True, soft_wrap=True)

RegistryOpt = Annotated[
    str | None,
    typer.Option(
        "--registry",
        envvar="SCHEMA_REGISTRY_URL",
        help="Schema registry URL (Confluent API) [default: the dev registry].",
    ),
]
SuffixOpt = Annotated[
    str, typer.Option(help="Suffix of the output topic names (a replay's own set).")
]


def _registry(settings: Settings) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient(settings.registry_config().client_conf())


def print_subjects(outcomes: list[Any]) -> None:
    t = Table("subject", "record", "schema id", "version", "compatibility")
    for o in outcomes:
        t.add_row(o.subject, o.record, str(o.schema_id), str(o.version or "?"), o.compatibility)
    out.print(t)


@schemas_app.command("register")
def register(registry: RegistryOpt = None, output_suffix: SuffixOpt = "") -> None:
    """Register every schema of the catalogue under its subject, each subject set to
    BACKWARD_TRANSITIVE (the registry's global config is left alone). Idempotent; a schema
    the registry refuses as incompatible fails the command (exit 1)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from streams.contracts.registry import register_schemas
    from streams.kafka.topics import Topics

    s = Settings.from_env(schema_registry_url=registry, output_suffix=output_suffix or None)
    try:
        outcomes = register_schemas(_registry(s), Topics.from_settings(s).all())
    except SchemaRegistryError as exc:
        err.print(f"refused: {exc.error_message}", markup=False)
        raise typer.Exit(1) from exc
    print_subjects(outcomes)


@dataclass(frozen=True, slots=True)
class Finding:
    file: str
    against: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def git_versions(path: Path) -> list[tuple[str, str]]:
    """Every committed version of ``path`` (following renames), newest first, as (short
    commit, text). Empty outside a git work tree or for a file never committed."""
    try:
        log = subprocess.run(
            ["git", "log", "--follow", "--format=%h", "--name-only", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=path.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return []
    lines = [line for line in log.splitlines() if line.strip()]
    versions: list[tuple[str, str]] = []
    for commit, name in zip(lines[::2], lines[1::2], strict=False):
        shown = subprocess.run(
            ["git", "show", f"{commit}:{name}"], cwd=top, capture_output=True, text=True
        )
        if shown.returncode == 0:  # a commit that deleted it has nothing to show
            versions.append((commit, shown.stdout))
    return versions


def check_history(path: Path, schema: Any) -> list[Finding]:
    """``schema`` (the file's current text, parsed) as the reader of every earlier version."""
    from streams.contracts.compat import incompatibilities

    findings = []
    for commit, text in git_versions(path):
        try:
            problems = incompatibilities(schema, json.loads(text))
        except Exception as exc:  # an old version that does not parse cannot be checked
            problems = [f"version {commit} is not a usable schema: {exc}"]
        findings.append(Finding(path.name, f"git {commit}", tuple(problems)))
    return findings


def check_registry(registry: Any, path: Path, text: str, subjects: list[str]) -> list[Finding]:
    """``text`` against every version the registry holds under each of ``subjects`` (the
    registry's own check, ``POST /compatibility/subjects/{s}/versions``)."""
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    findings = []
    held = set(registry.get_subjects())
    for subject in subjects:
        if subject not in held:
            continue  # a new subject: nothing to be compatible with yet
        try:
            ok = registry.test_compatibility_all_versions(subject, Schema(text, "AVRO"))
            problems = () if ok else ("the registry finds it incompatible",)
        except SchemaRegistryError as exc:
            problems = (f"the registry refused it: {exc.error_message}",)
        findings.append(Finding(path.name, f"registry {subject}", problems))
    return findings


def subjects_of(name: str, settings: Settings) -> list[str]:
    """The catalogue's subjects of the record whose schema file is ``<name>.avsc``."""
    from streams.kafka.topics import Topics

    return [
        subject
        for subject, model in Topics.from_settings(settings).subjects()
        if model.avro_name == name
    ]


@schemas_app.command("check")
def check(
    files: Annotated[
        list[Path] | None,
        typer.Argument(help="The .avsc files to check [default: every file in schemas/]."),
    ] = None,
    registry: RegistryOpt = None,
    output_suffix: SuffixOpt = "",
    offline: Annotated[
        bool, typer.Option("--offline", help="Check against git history only, not the registry.")
    ] = False,
) -> None:
    """Check that each schema file still reads everything written with its earlier versions:
    every version in git history (the file as the reader must resolve each old one as the
    writer) and every version the registry holds under its subjects. Exit 1 when one is
    incompatible, 2 when a file is not a schema."""
    paths = files or sorted(SCHEMA_DIR.glob("*.avsc"))
    s = Settings.from_env(schema_registry_url=registry, output_suffix=output_suffix or None)
    client = None if offline else _registry(s)
    findings: list[Finding] = []
    for path in paths:
        try:
            text = path.read_text()
            schema = json.loads(text)
            from streams.contracts.compat import expanded

            expanded(schema)
        except Exception as exc:
            err.print(f"{path}: not a readable Avro schema: {exc}", markup=False)
            raise typer.Exit(2) from exc
        findings += check_history(path.resolve(), schema)
        if client is not None:
            findings += check_registry(client, path, text, subjects_of(path.stem, s))
    bad = [f for f in findings if not f.ok]
    for f in bad:
        for problem in f.problems:
            out.print(f"{f.file}: against {f.against}: {problem}", markup=False)
    out.print(
        f"{len(paths)} schema file(s), {len(findings)} earlier version(s) checked: "
        + (f"{len(bad)} incompatible" if bad else "all compatible"),
        markup=False,
    )
    if bad:
        raise typer.Exit(1)


@schemas_app.command("enums")
def enums_cmd(
    files: Annotated[
        list[Path] | None,
        typer.Argument(help="The .avsc files [default: every file in schemas/]."),
    ] = None,
    check_only: Annotated[
        bool, typer.Option("--check", help="Only report the files that differ (exit 1).")
    ] = False,
) -> None:
    """Rewrite the enum definitions in the schema files from their one source, the enums of
    streams/contracts/models/enums.py (symbols in order, docstring as doc, default UNRECOGNIZED), so
    that an enum used by several records cannot drift between them."""
    from streams.contracts.enum_copies import sync

    paths = files or sorted(SCHEMA_DIR.glob("*.avsc"))
    differ = [p for p in paths if sync(p, write=not check_only)]
    for p in differ:
        out.print(f"{p}: {'differs' if check_only else 'rewritten'}", markup=False)
    out.print(f"{len(paths)} schema file(s), {len(differ)} with enums not as their source")
    if differ and check_only:
        raise typer.Exit(1)
