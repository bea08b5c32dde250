"""A fake E2B control plane (the REST API at E2B_API_URL) backed by a FakeEnvd.

Endpoints, as the e2b 2.6x SDK calls them:
- sandboxes: POST /v2/sandboxes, GET/DELETE /sandboxes/{id}, POST /sandboxes/{id}/timeout;
- template builds (v2 builder): POST /v3/templates, GET /templates/{tid}/files/{hash} (upload link),
  PUT /_upload/{tid}/{hash} (the link itself), POST /v2/templates/{tid}/builds/{bid} (start),
  GET /templates/{tid}/builds/{bid}/status (status + log entries from logsOffset).

Faults are injected per route with `fail(route, ...)`: N answers with a status code, or a slow
answer (the client's request timeout fires first). `fail_build_on` makes the build fail at the
first step whose text contains a substring, naming that step as the real API does ("reason.step").
The API key must arrive in X-API-KEY; `seen_api_keys` lets tests check what the SDK sent.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote

from .e2b_envd import ENVD_VERSION, FakeEnvd
from .wsgi_server import WSGIServer


@dataclass
class Fault:
    times: int
    status: int = 500
    delay: float = 0.0
    message: str = "injected fault"


@dataclass
class FakeBuild:
    template_id: str
    build_id: str
    name: str
    cpu_count: int | None
    memory_mb: int | None
    spec: dict[str, Any] | None = None
    status: str = "waiting"
    logs: list[dict[str, Any]] = field(default_factory=list)
    reason: dict[str, Any] | None = None
    polls: int = 0


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _step_text(step: dict[str, Any]) -> str:
    return f"{step.get('type', '')} {' '.join(str(a) for a in step.get('args') or [])}".strip()


class FakeControlPlane:
    """The REST side of the fake; `templates` holds the names a sandbox may be created from."""

    def __init__(self, envd: FakeEnvd, *, api_key: str, templates: tuple[str, ...] = ("base",)) -> None:
        self.envd = envd
        self.api_key = api_key
        self.templates: set[str] = set(templates)
        self.sandboxes: dict[str, dict[str, Any]] = {}
        self.builds: dict[str, FakeBuild] = {}
        self.uploads: dict[str, bytes] = {}
        self.faults: dict[str, list[Fault]] = {}
        self.calls: list[tuple[str, str, str]] = []  # (route, method, path)
        self.seen_api_keys: set[str] = set()
        self.fail_build_on: str | None = None
        self._idem: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.server = WSGIServer(self._app)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> FakeControlPlane:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def fail(self, route: str, *, times: int = 1, status: int = 500, delay: float = 0.0) -> None:
        """Answer the next `times` calls of `route` (e.g. "create", "build_request") with `status` after `delay` s.

        With a delay and status 0 the call succeeds after the delay (a slow but healthy answer)."""
        self.faults.setdefault(route, []).append(Fault(times, status, delay))

    def count(self, route: str) -> int:
        return sum(1 for r, _, _ in self.calls if r == route)

    # -- routing ---------------------------------------------------------------------------------
    _ROUTES: list[tuple[str, str, str]] = [
        ("POST", r"/v2/sandboxes", "create"),
        ("GET", r"/sandboxes/(?P<sid>[^/]+)", "get"),
        ("DELETE", r"/sandboxes/(?P<sid>[^/]+)", "kill"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/timeout", "set_timeout"),
        ("POST", r"/v3/templates", "build_request"),
        ("GET", r"/templates/(?P<tid>[^/]+)/files/(?P<hash>[^/]+)", "upload_link"),
        ("PUT", r"/_upload/(?P<tid>[^/]+)/(?P<hash>[^/]+)", "upload"),
        ("POST", r"/v2/templates/(?P<tid>[^/]+)/builds/(?P<bid>[^/]+)", "build_start"),
        ("GET", r"/templates/(?P<tid>[^/]+)/builds/(?P<bid>[^/]+)/status", "build_status"),
    ]

    def _app(self, environ: dict[str, Any], start_response: Any):
        method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
        body = environ["wsgi.input"].read()
        found = [
            (name, match)
            for m, pattern, name in self._ROUTES
            if m == method and (match := re.fullmatch(pattern, path))
        ]
        if not found:
            return _reply(start_response, 404, {"code": 404, "message": f"no route {method} {path}"})
        route, match = found[0]
        self.calls.append((route, method, path))
        if route != "upload":
            key = environ.get("HTTP_X_API_KEY", "")
            self.seen_api_keys.add(key)
            if key != self.api_key:
                return _reply(start_response, 401, {"code": 401, "message": "Invalid API key"})
        fault = self._take_fault(route)
        if fault is not None:
            time.sleep(fault.delay)
            if fault.status:
                return _reply(start_response, fault.status, {"code": fault.status, "message": fault.message})
        args = {k: unquote(v) for k, v in match.groupdict().items()}
        query = dict(parse_qsl(environ.get("QUERY_STRING", "")))
        data = json.loads(body) if body and route != "upload" else {}
        handler = getattr(self, f"_{route}")
        status, obj = handler(args=args, query=query, data=data, body=body, environ=environ)
        return _reply(start_response, status, obj)

    def _take_fault(self, route: str) -> Fault | None:
        with self._lock:
            queue = self.faults.get(route) or []
            if not queue:
                return None
            fault = queue[0]
            fault.times -= 1
            if fault.times <= 0:
                queue.pop(0)
            return fault

    # -- sandboxes -------------------------------------------------------------------------------
    def _create(self, data: dict[str, Any], environ: dict[str, Any], **_: Any) -> tuple[int, Any]:
        template = data.get("templateID", "")
        if template not in self.templates:
            return 404, {"code": 404, "message": f"template '{template}' not found"}
        idem = environ.get("HTTP_IDEMPOTENCY_KEY")
        with self._lock:
            if idem and idem in self._idem:
                return 201, self._idem[idem]
            if self.envd.stopped:
                return 503, {"code": 503, "message": "shutting down"}
            sid = "sb" + secrets.token_hex(6)
            token = "envd-" + secrets.token_hex(8)
            self.envd.add_sandbox(sid, token, data.get("envVars") or {})
            started = datetime.now(UTC)
            self.sandboxes[sid] = {
                "template": template,
                "metadata": data.get("metadata") or {},
                "timeout": data.get("timeout"),
                "started": started,
                "token": token,
            }
            resp = {
                "templateID": template,
                "sandboxID": sid,
                "clientID": "fake-client",
                "envdVersion": ENVD_VERSION,
                "envdAccessToken": token,
                "domain": None,
            }
            if idem:
                self._idem[idem] = resp
        return 201, resp

    def _get(self, args: dict[str, str], **_: Any) -> tuple[int, Any]:
        sb = self.sandboxes.get(args["sid"])
        if sb is None:
            return 404, {"code": 404, "message": f"sandbox {args['sid']} not found"}
        end = sb["started"] + timedelta(seconds=sb["timeout"] or 300)
        return 200, {
            "templateID": sb["template"],
            "sandboxID": args["sid"],
            "clientID": "fake-client",
            "startedAt": sb["started"].isoformat(),
            "endAt": end.isoformat(),
            "envdVersion": ENVD_VERSION,
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 1024,
            "state": "running",
            "metadata": sb["metadata"],
        }

    def _kill(self, args: dict[str, str], **_: Any) -> tuple[int, Any]:
        if self.sandboxes.pop(args["sid"], None) is None:
            return 404, {"code": 404, "message": f"sandbox {args['sid']} not found"}
        self.envd.remove_sandbox(args["sid"])
        return 204, None

    def _set_timeout(self, args: dict[str, str], data: dict[str, Any], **_: Any) -> tuple[int, Any]:
        sb = self.sandboxes.get(args["sid"])
        if sb is None:
            return 404, {"code": 404, "message": f"sandbox {args['sid']} not found"}
        sb["timeout"] = data.get("timeout")
        return 204, None

    # -- template builds -------------------------------------------------------------------------
    def _build_request(self, data: dict[str, Any], **_: Any) -> tuple[int, Any]:
        name = data["name"]
        tid, bid = "tpl" + secrets.token_hex(5), "bld" + secrets.token_hex(5)
        self.builds[bid] = FakeBuild(tid, bid, name, data.get("cpuCount"), data.get("memoryMB"))
        tags = data.get("tags") or ["default"]
        return 202, {
            "templateID": tid,
            "buildID": bid,
            "public": False,
            "names": [name],
            "tags": tags,
            "aliases": [name],
        }

    def _upload_link(self, args: dict[str, str], environ: dict[str, Any], **_: Any) -> tuple[int, Any]:
        key = f"{args['tid']}/{args['hash']}"
        if key in self.uploads:
            return 201, {"present": True}
        return 201, {"present": False, "url": f"{self.url}/_upload/{key}"}

    def _upload(self, args: dict[str, str], body: bytes, **_: Any) -> tuple[int, Any]:
        self.uploads[f"{args['tid']}/{args['hash']}"] = body
        return 200, {}

    def _build_start(self, args: dict[str, str], data: dict[str, Any], **_: Any) -> tuple[int, Any]:
        build = self.builds.get(args["bid"])
        if build is None or build.template_id != args["tid"]:
            return 404, {"code": 404, "message": f"build {args['bid']} not found"}
        build.spec = data
        build.status = "building"
        return 202, None

    def _run_build(self, build: FakeBuild) -> None:
        """Decide the build's outcome: every COPY must have been uploaded; `fail_build_on` fails its step."""
        spec = build.spec or {}

        def log(msg: str, level: str = "info") -> None:
            build.logs.append({"timestamp": _now(), "level": level, "message": msg})

        log(f"[base] FROM {spec.get('fromImage')}")
        steps = spec.get("steps") or []
        for i, step in enumerate(steps, start=1):
            text = _step_text(step)
            log(f"[builder {i}/{len(steps)}] {text}")
            if (
                step.get("type") == "COPY"
                and f"{build.template_id}/{step.get('filesHash')}" not in self.uploads
            ):
                build.status = "error"
                build.reason = {"message": f"files for step {i} were never uploaded", "step": str(i)}
                return
            if self.fail_build_on and self.fail_build_on in text:
                msg = f"failed to run command '{text}': exit status 1"
                log(msg, "error")
                build.status = "error"
                build.reason = {"message": msg, "step": str(i), "logEntries": build.logs[-1:]}
                return
        log(f"[finalize] start: {spec.get('startCmd')} ready: {spec.get('readyCmd')}")
        build.status = "ready"
        self.templates.add(build.name)

    def _build_status(self, args: dict[str, str], query: dict[str, str], **_: Any) -> tuple[int, Any]:
        build = self.builds.get(args["bid"])
        if build is None:
            return 404, {"code": 404, "message": f"build {args['bid']} not found"}
        build.polls += 1
        # report "building" once, so clients exercise their polling loop
        if build.status == "building" and build.polls > 1:
            self._run_build(build)
        offset = int(query.get("logsOffset") or 0)
        resp: dict[str, Any] = {
            "templateID": build.template_id,
            "buildID": build.build_id,
            "status": build.status,
            "logEntries": build.logs[offset:],
            "logs": [e["message"] for e in build.logs[offset:]],
        }
        if build.reason:
            resp["reason"] = build.reason
        return 200, resp


def _reply(start_response: Any, status: int, obj: Any) -> list[bytes]:
    phrase = {
        200: "OK",
        201: "Created",
        202: "Accepted",
        204: "No Content",
        401: "Unauthorized",
        404: "Not Found",
    }
    if obj is None:
        start_response(f"{status} {phrase.get(status, 'Status')}", [])
        return [b""]
    start_response(f"{status} {phrase.get(status, 'Status')}", [("Content-Type", "application/json")])
    return [json.dumps(obj).encode()]
