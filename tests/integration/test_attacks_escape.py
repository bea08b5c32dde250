"""Attack suite: probes run by a hostile agent inside a sandbox (local and docker) and every escape fails.

Sandbox A gets an egress (a small HTTP server of the test); B is a second sandbox holding a secret marker.
From inside A the probe script tries: capabilities, the engine socket, remounting read-only mounts, the
checkout's gold patch, B's workspace (host path, overlay path, /proc/*/root), B's blackbox server, an
extra host listener (on every host address), and a scan of the loopback ports. Only A's own egress
(and A's own blackbox server) may answer, and the egress must work.
"""

from __future__ import annotations

import http.server
import json
import secrets
import socket
import threading
from pathlib import Path

import pytest

import sweflow.sample
from sweflow.sandbox.base import BLACKBOX_PORT

try:  # the two backends' module fixtures (templates built from the sample repo)
    from tests.integration.test_sandbox_docker import env  # noqa: F401
    from tests.integration.test_sandbox_local import local  # noqa: F401
except ImportError:  # rootdir-relative collection
    from test_sandbox_docker import env  # type: ignore[no-redef]  # noqa: F401
    from test_sandbox_local import local  # type: ignore[no-redef]  # noqa: F401

pytestmark = [pytest.mark.integration]

GOLD = sorted(Path(sweflow.sample.__file__).parent.glob("tasks/*/gold.patch"))[0]

PROBE = r"""
import json, os, socket, subprocess, sys, urllib.request
a = json.loads(sys.argv[1])
out = {}

def connects(host, port, timeout=0.3):
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            return s.getsockname() != s.getpeername()  # a TCP self-connect is not a listener
    except OSError:
        return False

def readable(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(4096)
    except OSError:
        return None

status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
out["cap_eff"] = int(status["CapEff"].strip(), 16)
out["cap_prm"] = int(status["CapPrm"].strip(), 16)
out["docker_sock"] = []
for p in ("/var/run/docker.sock", "/run/docker.sock"):
    if os.path.exists(p):
        out["docker_sock"].append(p)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(p)
        out["docker_sock"].append("connected " + p)
    except OSError:
        pass
    s.close()
out["remounted"] = []
for m in ("/usr", "/etc", "/", "/proc/sys", "/sys"):
    r = subprocess.run(["mount", "-o", "remount,rw", m], capture_output=True)
    if r.returncode == 0:
        out["remounted"].append(m)
out["usr_writable"] = os.access("/usr", os.W_OK)
out["gold"] = readable(a["gold"]) is not None or os.path.exists(a["gold"])
out["other_paths"] = [p for p in a["other_paths"] if readable(p) is not None]
out["proc_leaks"] = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for rel in ("root/testbed/marker.txt", "cwd/marker.txt"):
            data = readable(f"/proc/{pid}/{rel}")
            if data and a["marker"].encode() in data:
                out["proc_leaks"].append(f"/proc/{pid}/{rel}")
out["other_blackbox"] = [p for p in a["other_ports"] if connects("127.0.0.1", p)]
out["host_ports"] = [f"{h}:{a['extra_port']}" for h in a["hosts"] if connects(h, a["extra_port"])]
out["open_loopback"] = [p for p in range(1, 65536) if connects("127.0.0.1", p, 0.05)]
try:
    with urllib.request.urlopen(a["egress_url"] + "/probe", timeout=5) as resp:
        out["egress"] = resp.read().decode()
except Exception as exc:
    out["egress"] = "error: %s" % exc
print(json.dumps(out))
"""


class _Egress(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = b"egress-ok " + self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def host_services():
    egress = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Egress)
    threading.Thread(target=egress.serve_forever, daemon=True).start()
    extra = socket.socket()
    extra.bind(("0.0.0.0", 0))
    extra.listen(16)
    hosts = {"127.0.0.1", "172.17.0.1", "10.0.2.2"}
    try:
        hosts |= {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        pass
    yield {"egress": f"127.0.0.1:{egress.server_address[1]}", "extra_port": extra.getsockname()[1],
           "hosts": sorted(hosts)}  # fmt: skip
    egress.shutdown()
    extra.close()


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def world(request):
    """(provider, template, host path of a sandbox's /testbed/marker.txt) for each backend."""
    if request.param == "local":
        provider, template, _ = request.getfixturevalue("local")
        return provider, template, lambda sb: [str(sb.dir / "testbed" / "marker.txt")]
    e = request.getfixturevalue("env")

    def host_paths(sb):
        data = e["client"].containers.get(sb.container.id).attrs.get("GraphDriver", {}).get("Data", {})
        return [f"{data[k]}/testbed/marker.txt" for k in ("MergedDir", "UpperDir") if data.get(k)]

    return e["host"], e["template"], host_paths


def test_a_hostile_agent_cannot_escape(world, host_services):
    provider, template, host_paths = world
    marker = secrets.token_hex(16)
    with (
        provider.create(template, timeout=300, egress=host_services["egress"]) as a,
        provider.create(template, timeout=300, egress=host_services["egress"]) as b,
    ):
        b.write_file("/testbed/marker.txt", marker)
        other_port = int(b.port_url(BLACKBOX_PORT).rsplit(":", 1)[1])
        args = {
            "gold": str(GOLD.resolve()),
            "other_paths": host_paths(b) + [str(GOLD.resolve())],
            "marker": marker,
            "other_ports": [other_port, int(a.port_url(BLACKBOX_PORT).rsplit(":", 1)[1])],
            "extra_port": host_services["extra_port"],
            "hosts": host_services["hosts"],
            "egress_url": a.egress_url,
        }
        a.write_file("/tmp/probe.py", PROBE)
        r = a.run(f"python3 /tmp/probe.py {json.dumps(json.dumps(args))}", timeout=120)
        assert r.ok, r
        got = json.loads(r.stdout)
        egress_port = int(a.egress_url.rsplit(":", 1)[1])
    print(provider.name, "probe results:", json.dumps(got, sort_keys=True))  # shown with -s / on failure
    assert got["cap_eff"] == 0 and got["cap_prm"] == 0, got
    assert got["docker_sock"] == [], got
    assert got["remounted"] == [], got
    if provider.name == "local":  # the host's /usr (a container's /usr is its own copy)
        assert not got["usr_writable"], got
    assert got["gold"] is False and got["other_paths"] == [], got
    assert got["proc_leaks"] == [], got
    assert got["other_blackbox"] == [], "neither B's nor A's own host-side port is reachable from inside"
    assert got["host_ports"] == [], got
    assert set(got["open_loopback"]) <= {egress_port, BLACKBOX_PORT}, got["open_loopback"]
    assert egress_port in got["open_loopback"], got["open_loopback"]
    assert got["egress"] == "egress-ok /probe", got


def test_a_sandbox_without_egress_reaches_nothing(world, host_services):
    provider, template, _ = world
    with provider.create(template, timeout=120) as sb:
        assert sb.egress_url is None
        probe = (
            "import socket, sys\n"
            "def c(h, p):\n"
            "    try:\n"
            "        with socket.create_connection((h, p), timeout=0.05) as s:\n"
            "            return s.getsockname() != s.getpeername()\n"
            "    except OSError:\n"
            "        return False\n"
            f"hosts = {host_services['hosts']!r}\n"
            f"print([p for p in range(1, 65536) if c('127.0.0.1', p)], [h for h in hosts if c(h, {host_services['extra_port']})])\n"
        )
        sb.write_file("/tmp/p.py", probe)
        r = sb.run("python3 /tmp/p.py", timeout=120)
        assert r.ok, r
        assert r.stdout.strip() == f"[{BLACKBOX_PORT}] []", "only its own server, no host port"
