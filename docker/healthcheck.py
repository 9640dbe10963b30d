"""Container health probe for the vigil image (``HEALTHCHECK`` in docker/Dockerfile).

``vigil worker`` serves HTTP on ``VIGIL_WEB_PORT``: the probe asks for Faust's index ``/``
(``{"status": "OK"}``; 401 when ``VIGIL_API_TOKEN`` is set, the probe sends no token) and is
healthy on any HTTP answer below 500. The web
server starts before partitions are assigned, so this is a liveness signal, not "caught up".
``vigil ticker`` serves ``/healthz`` on ``VIGIL_TICKER_PORT`` (6068): 503 once no round of
ticks was delivered for a few intervals, so a ticker that runs but cannot write is unhealthy.
``vigil alert-bridge`` serves ``/healthz`` on ``VIGIL_ALERT_BRIDGE_PORT`` (6069): 503 while its
consumer holds no assignment or Alertmanager has accepted no post for 2 minutes.
``vigil reconcile`` serves ``/healthz`` on ``VIGIL_RECONCILER_PORT`` (6070): 503 while its
consumer holds no assignment.
The other commands (``topics create``...) serve nothing: the probe reports them healthy.

Exit 0: healthy, 1: unhealthy (Docker's convention). Standard library only.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def main_command(cmdline_path: str = "/proc/1/cmdline") -> list[str]:
    """The argv of the container's PID 1 (``vigil worker``, or ``docker-init -- vigil worker``)."""
    try:
        with open(cmdline_path, "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def probe_url() -> str:
    host = os.environ.get("VIGIL_WEB_HOST", "").strip()
    host = "127.0.0.1" if host in WILDCARDS else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = os.environ.get("VIGIL_WEB_PORT", "").strip() or "6066"
    return f"http://{host}:{port}/"


def health_url(host_env: str, port_env: str, default_port: str) -> str:
    """``/healthz`` of a process serving its own (the ticker, the alert bridge)."""
    host = os.environ.get(host_env, "").strip()
    host = "127.0.0.1" if host in WILDCARDS else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = os.environ.get(port_env, "").strip() or default_port
    return f"http://{host}:{port}/healthz"


def ticker_url() -> str:
    return health_url("VIGIL_TICKER_HOST", "VIGIL_TICKER_PORT", "6068")


def alert_bridge_url() -> str:
    return health_url("VIGIL_ALERT_BRIDGE_HOST", "VIGIL_ALERT_BRIDGE_PORT", "6069")


def reconcile_url() -> str:
    return health_url("VIGIL_RECONCILER_HOST", "VIGIL_RECONCILER_PORT", "6070")


def check(url: str, timeout: float = 3.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status < 500, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return exc.code < 500, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return False, str(exc)


def main(argv: list[str] | None = None) -> int:
    argv = main_command() if argv is None else argv
    if "worker" in argv:
        what, url = "worker", probe_url()
    elif "ticker" in argv:
        what, url = "ticker", ticker_url()
    elif "alert-bridge" in argv:
        what, url = "alert-bridge", alert_bridge_url()
    elif "reconcile" in argv:
        what, url = "reconcile", reconcile_url()
    else:
        return 0
    healthy, detail = check(url)
    if not healthy:
        print(f"vigil {what} not healthy at {url}: {detail}", file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
