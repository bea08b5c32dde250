"""Local templates: the prepared workspace (repo, conda shim, runtime venv) every local sandbox copies.

Layout under `templates_root` (default $SWEFLOW_LOCAL_TEMPLATES or ~/.cache/sweflow/local-templates): see
above `LocalTemplates`, which is mixed into `LocalProvider` (`sweflow.sandbox.local`); the shared venvs
are built as the sandbox uid under bwrap.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import tempfile
import uuid
from pathlib import Path

from ..errors import SandboxError
from ..util import atomic_write_json, read_json, replace_folder, run_cmd, sha256_bytes, stable_json
from . import ledger
from .base import TemplateRecord
from .images import CONDA_ACTIVATE, CONDA_BIN
from .local_bwrap import UMASK, _bwrap, _chown_tree, _mkdir, _searchable, check_unprivileged
from .spec import RUNTIME_DIR, TemplateSpec

SYSTEM_PYTHON = "/usr/bin/python3"


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


# Layout under `templates_root` (default $SWEFLOW_LOCAL_TEMPLATES or ~/.cache/sweflow/local-templates):
#   <name>/testbed/          the repo (git) every sandbox copies
#   <name>/template.json     metadata (image, spec hash, start command, runtime and claude paths)
#   _shared/conda-<h>/       conda shim + a python venv `envs/testbed` (with pytest), bound at /opt/miniconda3
#   _shared/runtime-<h>/     the isolated runtime venv with the sweflow wheel, bound at /opt/sweflow/runtime
#   _sandboxes/<id>/         per sandbox: testbed (/testbed), tmp (/tmp), home (/root), run (/run/sweflow,
#                            the socket folder), bg (background logs, host only)
#
# `LocalTemplates` is mixed into `LocalProvider` (`sweflow.sandbox.local`), whose `__init__` sets what it
# reads (root, uid, testbed_requirements); the shared venvs are built as the sandbox uid under bwrap.
class LocalTemplates:
    """The template half of `LocalProvider`: build a template's workspace and the venvs templates share."""

    name: str
    root: Path
    uid: int
    testbed_requirements: tuple[str, ...]

    def _prepare_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _searchable(self.root)
        check_unprivileged(self.uid)

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
        self._prepare_root()
        tdir = self.template_dir(name)
        work = self.root / "_building" / f"{name}-{uuid.uuid4().hex[:8]}"
        entry = ledger.record("building", self.name, work.name, path=str(work))
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
            claude = Path(spec.claude_binary).resolve() if spec.claude_binary else None
            if claude is not None:
                _searchable(claude.parent)
                claude.chmod(claude.stat().st_mode | 0o555)
            meta = {
                "name": name,
                "image": spec.image,
                "spec_hash": spec.spec_hash(),
                "source": source,
                "start_cmd": spec.start_cmd,
                "conda": str(conda),
                "runtime": str(runtime),
                "claude": str(claude) if claude else "",
            }
            atomic_write_json(work / "template.json", meta)
            replace_folder(work, tdir)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            if not work.exists():
                ledger.forget(entry)
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
            _mkdir(dest, 0o755)
            _mkdir(dest / "bin", 0o755)
            (dest / "bin" / "activate").write_text(CONDA_ACTIVATE)
            (dest / "bin" / "activate").chmod(0o644)
            (dest / "bin" / "conda").write_text(CONDA_BIN)
            (dest / "bin" / "conda").chmod(0o755)
            cmd = f"{SYSTEM_PYTHON} -m venv /opt/miniconda3/envs/testbed"
            if self.testbed_requirements:
                reqs = " ".join(self.testbed_requirements)
                cmd += (
                    f" && /opt/miniconda3/envs/testbed/bin/pip install -q --disable-pip-version-check {reqs}"
                )
            self._build_in_bwrap(cmd, {str(dest): "/opt/miniconda3"}, what="conda shim env")
            (dest / ".ready").touch()
        return dest

    def _shared_runtime(self, spec: TemplateSpec) -> Path:
        wheel = spec.runtime_wheel
        if wheel is None:
            from .artifacts import build_wheel

            wdir = self.root / "_shared" / "wheel"
            wdir.mkdir(parents=True, exist_ok=True)
            with _file_lock(self.root / "_shared" / ".wheel.lock"):
                cached = read_json(wdir / "wheel.json") if (wdir / "wheel.json").exists() else None
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
            _mkdir(dest, 0o755)
            # the build runs as the sandbox uid: give it a readable copy of the wheel in its own folder
            stage = Path(tempfile.mkdtemp(prefix=".wheel-", dir=self.root / "_shared"))
            try:
                shutil.copy2(wheel, stage / Path(wheel).name)
                whl = f"/opt/sweflow/wheel/{Path(wheel).name}"
                cmd = (
                    f"{SYSTEM_PYTHON} -m venv {RUNTIME_DIR} && {RUNTIME_DIR}/bin/python -m pip install -q"
                    f" --no-deps --no-index --ignore-requires-python --disable-pip-version-check {whl}"
                )
                self._build_in_bwrap(
                    cmd, {str(dest): RUNTIME_DIR, str(stage): "/opt/sweflow/wheel"}, what="runtime venv",
                    ro={"/opt/sweflow/wheel"},
                )  # fmt: skip
            finally:
                shutil.rmtree(stage, ignore_errors=True)
            (dest / ".ready").touch()
        return dest

    def _build_in_bwrap(
        self, cmd: str, binds: dict[str, str], *, what: str, ro: set[str] = frozenset()
    ) -> None:
        """Run a build command (our code, with network for pip) as the sandbox uid under bwrap, with host
        dirs bound at their in-sandbox paths (rw unless in `ro`); the results end up owned by root."""
        shared = _mkdir(self.root / "_shared", 0o755, exist_ok=True)
        _searchable(shared)
        with tempfile.TemporaryDirectory(prefix=".home-", dir=shared) as home:
            os.chmod(home, 0o700)
            for path in [home, *binds]:
                _searchable(Path(path))
                _chown_tree(Path(path), self.uid)
            args = _bwrap(self.uid, own_net=False) + ["--tmpfs", "/tmp", "--bind", home, "/root"]
            args += ["--tmpfs", "/opt"]
            for src, dst in binds.items():
                args += ["--ro-bind" if dst in ro else "--bind", src, dst]
            args += ["--setenv", "HOME", "/root", "--", "/bin/bash", "-c", cmd]
            res = run_cmd(args, timeout=900, umask=UMASK)
            for src in binds:
                _chown_tree(Path(src), 0)  # sandboxes get these read-only, and not as their owner
        if res.returncode != 0:
            raise SandboxError(f"building the {what} failed: {(res.stderr or res.stdout).strip()[-400:]}")


def _clone_at(repo: Path, commit: str, dest: Path) -> None:
    res = run_cmd(
        ["git", "clone", "--quiet", "--no-hardlinks", str(repo), str(dest)], timeout=600, umask=UMASK
    )
    if res.returncode != 0:
        raise SandboxError(f"git clone failed: {res.stderr.strip()}", file=str(repo))
    for args in (["checkout", "--quiet", "--detach", commit], ["remote", "remove", "origin"]):
        res = run_cmd(["git", "-C", str(dest), *args], timeout=120, umask=UMASK)
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
    entry = ledger.record("container", "docker", cid[:12], container=cid)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        res = run_cmd(
            f"docker cp {cid}:/testbed - | tar -x -C {shlex.quote(str(dest.parent))}",
            timeout=900,
            umask=UMASK,
        )
        if res.returncode != 0 or not dest.is_dir():
            raise SandboxError(f"exporting /testbed failed: {res.stderr.strip()}", file=image)
    finally:
        if run_cmd(["docker", "rm", "-f", cid], timeout=120).returncode == 0:
            ledger.forget(entry)
