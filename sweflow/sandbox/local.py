"""Local sandboxes without a container engine: a prepared workspace per template, bubblewrap per command.

Layout under `templates_root` (default $SWEFLOW_LOCAL_TEMPLATES or ~/.cache/sweflow/local-templates):
  <name>/testbed/          the repo (git) every sandbox copies
  <name>/template.json     metadata (image, spec hash, start command, runtime and claude paths)
  _shared/conda-<h>/       conda shim + a python venv `envs/testbed` (with pytest), bound at /opt/miniconda3
  _shared/runtime-<h>/     the isolated runtime venv with the sweflow wheel, bound at /opt/sweflow/runtime
  _sandboxes/<id>/         per sandbox: testbed copy (/testbed), tmp (/tmp), home (/root), background logs

Every command is its own `bwrap` (host root read-only, own /tmp and /root, new pid namespace,
--die-with-parent); venvs are created inside bwrap at their final paths so their scripts' shebangs resolve.

Ports: the sandbox shares the host network, so two sandboxes cannot both listen on 31000. Each sandbox gets
a free host port, passed to every command as SWEFLOW_BLACKBOX_PORT (with SWEFLOW_BLACKBOX_HOST=127.0.0.1);
the template's start command serves the blackbox there and `port_url(31000)` returns that URL. Any other
port maps to itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import SandboxError
from ..util import atomic_write_json, free_port, read_json, run_cmd, sha256_bytes, stable_json
from .base import BLACKBOX_PORT, CommandResult, SandboxBase, TemplateRecord, tail
from .images import CONDA_ACTIVATE, CONDA_BIN
from .spec import CLAUDE_PATH, RUNTIME_DIR, TemplateSpec

SYSTEM_PYTHON = "/usr/bin/python3"
# Host top-level entries not exposed to the sandbox (replaced or private).
_HIDDEN = {"proc", "dev", "tmp", "opt", "root", "testbed", "sys", "home", "old_root", "lost+found"}
_PATH = "/opt/miniconda3/envs/testbed/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMEOUT_EXIT = 124


def default_root() -> Path:
    env = os.environ.get("SWEFLOW_LOCAL_TEMPLATES")
    if env:
        return Path(env)
    return Path(os.environ.get("SWEFLOW_CACHE") or Path.home() / ".cache" / "sweflow") / "local-templates"


@contextlib.contextmanager
def _file_lock(path: Path):
    """Cross-process lock so parallel builds share the _shared venvs instead of racing on them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _bwrap_base() -> list[str]:
    if shutil.which("bwrap") is None:
        raise SandboxError("bubblewrap (bwrap) is not installed", hint="apt-get install bubblewrap")
    args = [
        "bwrap",
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        "sandbox",
    ]
    for entry in sorted(os.listdir("/")):
        if entry not in _HIDDEN:
            args += ["--ro-bind-try", f"/{entry}", f"/{entry}"]
    return args + ["--dev", "/dev", "--proc", "/proc"]


class LocalProvider:
    """Provider over prepared workspaces; options: templates_root, start_server, testbed_requirements."""

    name = "local"

    def __init__(
        self,
        templates_root: str | os.PathLike | None = None,
        *,
        start_server: bool = True,
        testbed_requirements: tuple[str, ...] = ("pytest",),
    ) -> None:
        self.root = Path(templates_root) if templates_root else default_root()
        self.start_server = start_server
        self.testbed_requirements = tuple(testbed_requirements)

    # ---- templates -------------------------------------------------------------------------------
    def template_dir(self, name: str) -> Path:
        return self.root / name

    def has_template(self, name: str) -> bool:
        return (self.template_dir(name) / "template.json").exists()

    def build(
        self,
        spec: TemplateSpec,
        name: str,
        *,
        repo: str | os.PathLike | None = None,
        commit: str | None = None,
    ) -> TemplateRecord:
        """Prepare the workspace: testbed from `repo`@`commit` if given, else exported from the task image."""
        tdir = self.template_dir(name)
        work = self.root / "_building" / f"{name}-{uuid.uuid4().hex[:8]}"
        work.mkdir(parents=True)
        try:
            if repo is not None:
                if not commit:
                    raise SandboxError("a commit is required with repo", file=str(repo), field="commit")
                _clone_at(Path(repo), commit, work / "testbed")
                source = {"repo": str(repo), "commit": commit}
            else:
                _export_testbed(spec.image, work / "testbed")
                source = {"image": spec.image}
            conda = self._shared_conda()
            runtime = self._shared_runtime(spec)
            meta = {
                "name": name,
                "image": spec.image,
                "spec_hash": spec.spec_hash(),
                "source": source,
                "start_cmd": spec.start_cmd,
                "conda": str(conda),
                "runtime": str(runtime),
                "claude": str(Path(spec.claude_binary).resolve()) if spec.claude_binary else "",
            }
            atomic_write_json(work / "template.json", meta)
            old = tdir.with_name(f".{name}.old-{uuid.uuid4().hex[:6]}")
            if tdir.exists():
                os.replace(tdir, old)
            os.replace(work, tdir)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return TemplateRecord(
            image=spec.image,
            provider=self.name,
            template=name,
            spec_hash=meta["spec_hash"],
            build_id=sha256_bytes(stable_json(meta, indent=None))[:16],
            extra={"path": str(tdir)},
        )

    def _shared_conda(self) -> Path:
        key = sha256_bytes(stable_json([CONDA_ACTIVATE, CONDA_BIN, sorted(self.testbed_requirements)]))[:12]
        dest = self.root / "_shared" / f"conda-{key}"
        with _file_lock(self.root / "_shared" / f".conda-{key}.lock"):
            if (dest / ".ready").exists():
                return dest
            shutil.rmtree(dest, ignore_errors=True)
            (dest / "bin").mkdir(parents=True)
            (dest / "bin" / "activate").write_text(CONDA_ACTIVATE)
            (dest / "bin" / "conda").write_text(CONDA_BIN)
            (dest / "bin" / "conda").chmod(0o755)
            cmd = f"{SYSTEM_PYTHON} -m venv /opt/miniconda3/envs/testbed"
            if self.testbed_requirements:
                reqs = " ".join(self.testbed_requirements)
                cmd += (
                    f" && /opt/miniconda3/envs/testbed/bin/pip install -q --disable-pip-version-check {reqs}"
                )
            _build_in_bwrap(cmd, {str(dest): "/opt/miniconda3"}, what="conda shim env")
            (dest / ".ready").touch()
        return dest

    def _shared_runtime(self, spec: TemplateSpec) -> Path:
        wheel = spec.runtime_wheel
        if wheel is None:
            from .artifacts import build_wheel

            wdir = self.root / "_shared" / "wheel"
            wdir.mkdir(parents=True, exist_ok=True)
            with _file_lock(self.root / "_shared" / ".wheel.lock"):
                from ..util import read_json as _rj

                cached = _rj(wdir / "wheel.json") if (wdir / "wheel.json").exists() else None
                info = build_wheel(wdir, cached=cached)
                atomic_write_json(wdir / "wheel.json", info)
            wheel = wdir / info["path"]
        from ..util import sha256_file

        key = sha256_file(wheel)[:12]
        dest = self.root / "_shared" / f"runtime-{key}"
        with _file_lock(self.root / "_shared" / f".runtime-{key}.lock"):
            if (dest / ".ready").exists():
                return dest
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            whl = f"/opt/sweflow/wheel/{Path(wheel).name}"
            cmd = (
                f"{SYSTEM_PYTHON} -m venv {RUNTIME_DIR} && {RUNTIME_DIR}/bin/python -m pip install -q --no-deps"
                f" --no-index --ignore-requires-python --disable-pip-version-check {whl}"
            )
            _build_in_bwrap(cmd, {str(dest): RUNTIME_DIR, str(wheel): whl}, what="runtime venv", ro={whl})
            (dest / ".ready").touch()
        return dest

    # ---- sandboxes -------------------------------------------------------------------------------
    def create(
        self,
        template: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> LocalSandbox:
        """Copy the template's workspace into a fresh sandbox and (by default) start its server."""
        tdir = self.template_dir(template)
        if not (tdir / "template.json").exists():
            raise SandboxError(
                "local template not built", file=str(tdir), row=template, hint="run build_template"
            )
        meta = read_json(tdir / "template.json")
        sb = LocalSandbox(self, template, meta, timeout=timeout, env=env or {}, metadata=metadata or {})
        try:
            if self.start_server and meta.get("start_cmd"):
                sb.server = sb.start(meta["start_cmd"])
        except BaseException:
            sb.kill()
            raise
        return sb


class _LocalBackground:
    """A background command: output goes to files (no pipe to fill up), the group is killed on kill()."""

    def __init__(self, proc: subprocess.Popen, out: Path, err: Path, started: float) -> None:
        self.proc, self.out, self.err, self.started = proc, out, err, started
        self._result: CommandResult | None = None

    def poll(self) -> CommandResult | None:
        if self._result is None:
            rc = self.proc.poll()
            if rc is None:
                return None
            self._result = CommandResult(
                rc, _read_tail(self.out), _read_tail(self.err), False, time.monotonic() - self.started
            )
        return self._result

    def kill(self) -> None:
        _kill_group(self.proc)


class LocalSandbox(SandboxBase):
    def __init__(
        self,
        provider: LocalProvider,
        template: str,
        meta: dict[str, Any],
        *,
        timeout: float,
        env: dict[str, str],
        metadata: dict[str, str],
    ) -> None:
        sid = f"local-{uuid.uuid4().hex[:12]}"
        super().__init__(sid, template)
        self.metadata = dict(metadata)
        self.meta = meta
        self.dir = provider.root / "_sandboxes" / sid
        self.blackbox_port = free_port()
        self.server: _LocalBackground | None = None
        self._procs: list[subprocess.Popen] = []
        self._plock = threading.Lock()
        self._bg_ids = itertools.count()
        for sub in ("tmp", "home", "bg"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        res = run_cmd(
            ["cp", "-a", str(provider.template_dir(template) / "testbed"), str(self.dir / "testbed")],
            timeout=600,
        )
        if res.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise SandboxError(f"copying the workspace failed: {res.stderr.strip()}", file=template, row=sid)
        self.env = {
            "PATH": _PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "SWEFLOW_BLACKBOX_PORT": str(self.blackbox_port),
            "SWEFLOW_BLACKBOX_HOST": "127.0.0.1",
        }
        self.env.update(env)
        self._timer = threading.Timer(timeout, self.kill)
        self._timer.daemon = True
        self._timer.start()

    # ---- plumbing --------------------------------------------------------------------------------
    def _argv(self, cmd: list[str], env: dict[str, str] | None, cwd: str | None) -> list[str]:
        args = _bwrap_base() + [
            "--bind", str(self.dir / "tmp"), "/tmp",
            "--bind", str(self.dir / "home"), "/root",
            "--tmpfs", "/opt",
            "--ro-bind", self.meta["conda"], "/opt/miniconda3",
            "--ro-bind", self.meta["runtime"], RUNTIME_DIR,
            "--bind", str(self.dir / "testbed"), "/testbed",
        ]  # fmt: skip
        if self.meta.get("claude"):
            args += ["--tmpfs", str(Path(CLAUDE_PATH).parent), "--ro-bind", self.meta["claude"], CLAUDE_PATH]
        args += ["--chdir", cwd or "/testbed", "--clearenv"]
        for k, v in {**self.env, **(env or {})}.items():
            args += ["--setenv", k, v]
        return args + cmd

    def _popen(self, argv: list[str], **kw: Any) -> subprocess.Popen:
        self._check_alive()
        with self._plock:
            proc = subprocess.Popen(argv, start_new_session=True, **kw)
            self._procs.append(proc)
        return proc

    def _exec(
        self, cmd: list[str], *, timeout: float, env=None, cwd=None, input: bytes | None = None
    ) -> tuple[int, bytes, bytes, bool, float]:
        t0 = time.monotonic()
        proc = self._popen(
            self._argv(cmd, env, cwd),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(input, timeout=timeout)
            return proc.returncode, out, err, False, time.monotonic() - t0
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return TIMEOUT_EXIT, out, err, True, time.monotonic() - t0
        finally:
            with self._plock:
                if proc in self._procs:
                    self._procs.remove(proc)

    # ---- Sandbox API -----------------------------------------------------------------------------
    def run(self, cmd: str, *, timeout: float, env=None, cwd=None) -> CommandResult:
        """Run through bash; on timeout the process group is killed and exit_code is 124."""
        rc, out, err, timed_out, dur = self._exec(["/bin/bash", "-c", cmd], timeout=timeout, env=env, cwd=cwd)
        return CommandResult(
            rc, tail(out.decode("utf-8", "replace")), tail(err.decode("utf-8", "replace")), timed_out, dur
        )

    def start(self, cmd: str, *, env=None, cwd=None) -> _LocalBackground:
        n = next(self._bg_ids)
        out, err = self.dir / "bg" / f"{n}.out", self.dir / "bg" / f"{n}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = self._popen(
                self._argv(["/bin/bash", "-c", cmd], env, cwd), stdin=subprocess.DEVNULL, stdout=fo, stderr=fe
            )
        return _LocalBackground(proc, out, err, time.monotonic())

    def write_file(self, path: str, data: bytes | str, *, timeout: float = 60) -> None:
        payload = data.encode("utf-8") if isinstance(data, str) else data
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        rc, _, err, timed_out, _ = self._exec(
            ["/bin/bash", "-c", script, "w", path], timeout=timeout, input=payload
        )
        if rc != 0 or timed_out:
            raise SandboxError(
                f"write_file failed: {err.decode(errors='replace').strip()}", file=path, row=self.id
            )

    def read_file(self, path: str, *, timeout: float = 60) -> bytes:
        rc, out, err, timed_out, _ = self._exec(["/bin/cat", "--", path], timeout=timeout)
        if rc != 0 or timed_out:
            raise SandboxError(
                f"read_file failed: {err.decode(errors='replace').strip()}", file=path, row=self.id
            )
        return out

    def port_url(self, port: int) -> str:
        return f"http://127.0.0.1:{self.blackbox_port if port == BLACKBOX_PORT else port}"

    def _kill(self) -> None:
        self._timer.cancel()
        with self._plock:
            procs, self._procs = list(self._procs), []
        for p in procs:
            _kill_group(p)
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- helpers -----------------------------------------------------------------------------------------
def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _read_tail(path: Path, limit: int = 64_000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit * 4))
            return tail(fh.read().decode("utf-8", "replace"), limit)
    except FileNotFoundError:
        return ""


def _build_in_bwrap(cmd: str, binds: dict[str, str], *, what: str, ro: set[str] = frozenset()) -> None:
    """Run a build command under bwrap with host dirs bound (rw unless in `ro`) at their in-sandbox paths."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sweflow-bwrap-") as home:
        args = _bwrap_base() + ["--tmpfs", "/tmp", "--bind", home, "/root", "--tmpfs", "/opt"]
        for src, dst in binds.items():
            args += ["--ro-bind" if dst in ro else "--bind", src, dst]
        args += ["--setenv", "HOME", "/root", "/bin/bash", "-c", cmd]
        res = run_cmd(args, timeout=900)
    if res.returncode != 0:
        raise SandboxError(f"building the {what} failed: {(res.stderr or res.stdout).strip()[-400:]}")


def _clone_at(repo: Path, commit: str, dest: Path) -> None:
    res = run_cmd(["git", "clone", "--quiet", "--no-hardlinks", str(repo), str(dest)], timeout=600)
    if res.returncode != 0:
        raise SandboxError(f"git clone failed: {res.stderr.strip()}", file=str(repo))
    for args in (["checkout", "--quiet", "--detach", commit], ["remote", "remove", "origin"]):
        res = run_cmd(["git", "-C", str(dest), *args], timeout=120)
        if res.returncode != 0:
            raise SandboxError(f"git {args[0]} failed: {res.stderr.strip()}", file=str(repo), field=commit)


def _export_testbed(image: str, dest: Path) -> None:
    """Copy /testbed out of a task image with the docker CLI (no container is started)."""
    if shutil.which("docker") is None:
        raise SandboxError(
            "docker CLI needed to export /testbed from a task image",
            file=image,
            hint="or build the local template from repo + commit",
        )
    res = run_cmd(["docker", "create", image, "true"], timeout=120)
    if res.returncode != 0:
        raise SandboxError(f"docker create failed: {res.stderr.strip()}", file=image)
    cid = res.stdout.strip()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        res = run_cmd(f"docker cp {cid}:/testbed - | tar -x -C {shlex.quote(str(dest.parent))}", timeout=900)
        if res.returncode != 0 or not dest.is_dir():
            raise SandboxError(f"exporting /testbed failed: {res.stderr.strip()}", file=image)
    finally:
        run_cmd(["docker", "rm", "-f", cid], timeout=120)
