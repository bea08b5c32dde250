"""Smoke test of a built template: start a sandbox, wait for the blackbox /health, read /v1/status, stop.

Health is probed inside the sandbox with curl (on the port the sandbox's server really listens on,
31000, in the sandbox's own network namespace) and, when the provider exposes it, from the host through port_url.
"""

from __future__ import annotations

import json
import shlex
import time
import urllib.request
from typing import Any

from ..errors import SandboxError
from .base import BLACKBOX_PORT, Provider, Sandbox

_INSIDE = "curl -fsS --max-time 5 %s http://127.0.0.1:" + str(BLACKBOX_PORT) + "%s"


def _auth(sb: Sandbox) -> dict[str, str]:
    token = getattr(sb, "blackbox_token", None)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _inside(sb: Sandbox, path: str) -> str:
    """The in-sandbox curl of `path`, with the sandbox's token (smoke runs before any agent does)."""
    hdr = " ".join(f"-H {shlex.quote(f'{k}: {v}')}" for k, v in _auth(sb).items())
    return _INSIDE % (hdr, path)


def _get(url: str, timeout: float, headers: dict[str, str] | None = None) -> dict[str, Any]:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback/provider URL only
        return json.loads(resp.read().decode("utf-8"))


def _server_log(sb: Sandbox) -> str:
    """Best-effort tail of the server's output for error messages."""
    server = getattr(sb, "server", None)
    try:
        if server is not None and (res := server.poll()) is not None:
            return (res.stderr or res.stdout)[-300:]
        res = sb.run("tail -c 300 /tmp/sweflow-server.log 2>/dev/null", timeout=10)
        return res.stdout
    except Exception:  # noqa: BLE001 - only decorates an error message
        return ""


def smoke(provider: Provider, template: str, *, timeout: float = 120, sandbox_timeout: float = 600) -> dict:
    """Return {template, provider, ok: True, version, status_keys, timings{create, health, host, status, total}}.

    Raises SandboxError(file=template, field=<step>) with step in create/health/host/status.
    """
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    step = "create"
    sb: Sandbox | None = None
    try:
        sb = provider.create(template, timeout=sandbox_timeout, metadata={"purpose": "smoke"})
        timings["create"] = round(time.monotonic() - t0, 3)
        step = "health"
        deadline = time.monotonic() + timeout
        health: dict[str, Any] = {}
        last = ""
        while True:
            res = sb.run(_inside(sb, "/health"), timeout=10)
            if res.ok:
                health = json.loads(res.stdout)
                break
            last = (res.stderr or res.stdout).strip()
            if time.monotonic() > deadline:
                raise SandboxError(f"no healthy answer in {timeout:.0f}s: {last} {_server_log(sb)}".strip())
            time.sleep(0.5)
        if health.get("healthy") is not True:
            raise SandboxError(f"unhealthy answer: {health}")
        timings["health"] = round(time.monotonic() - t0, 3)
        step = "host"
        try:
            base = sb.port_url(BLACKBOX_PORT)
        except SandboxError:
            base = ""  # not reachable from the host (docker network none): inside check is enough
        if base:
            host_health = _get(base + "/health", 10)
            if host_health.get("healthy") is not True:
                raise SandboxError(f"unhealthy answer from {base}: {host_health}")
            timings["host"] = round(time.monotonic() - t0, 3)
        step = "status"
        if base:
            status = _get(base + "/v1/status", 10, _auth(sb))
        else:
            res = sb.run(_inside(sb, "/v1/status"), timeout=15)
            if not res.ok:
                raise SandboxError(f"GET /v1/status failed: {res.stderr.strip() or res.exit_code}")
            status = json.loads(res.stdout)
        timings["status"] = round(time.monotonic() - t0, 3)
    except SandboxError as exc:
        raise SandboxError(f"smoke failed at {step}: {exc.problem}", file=template, field=step) from exc
    except Exception as exc:  # noqa: BLE001 - urllib/json faults still name template and step
        raise SandboxError(f"smoke failed at {step}: {exc}", file=template, field=step) from exc
    finally:
        if sb is not None:
            sb.kill()
    timings["total"] = round(time.monotonic() - t0, 3)
    return {
        "template": template,
        "provider": provider.name,
        "ok": True,
        "version": health.get("version", ""),
        "status_keys": sorted(status) if isinstance(status, dict) else [],
        "host_reachable": bool(base),
        "timings": timings,
    }
