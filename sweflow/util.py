"""The one place for shared mechanisms: atomic writes, hashing, stable JSON, subprocess, retries, logging."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("sweflow")


def stable_json(obj: Any, *, indent: int | None = 2) -> str:
    """Byte-stable JSON: sorted keys, no NaN, trailing newline when indented."""
    text = json.dumps(obj, sort_keys=True, indent=indent, ensure_ascii=False, allow_nan=False)
    return text + "\n" if indent is not None else text


def jsonl_line(obj: Any) -> str:
    """One compact, key-sorted JSON line (with newline)."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"


@contextlib.contextmanager
def _atomic_file(path: str | os.PathLike, mode: int | None):
    """A binary file handle on a temp file beside ``path``, fsynced and renamed onto it on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644 if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str, *, mode: int | None = None) -> Path:
    """Write a file via a temp file in the same folder and rename, so no partial output is ever left."""
    with _atomic_file(path, mode) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def atomic_write_lines(path: str | os.PathLike, lines: Iterable[str]) -> Path:
    """``atomic_write`` of the lines one after another (never joined into one string in memory)."""
    with _atomic_file(path, None) as fh:
        for line in lines:
            fh.write(line.encode("utf-8"))
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write byte-stable JSON."""
    return atomic_write(path, stable_json(obj))


def write_if_changed(path: str | os.PathLike, data: bytes | str) -> bool:
    """Atomically write only when the bytes differ, keeping the mtime of unchanged files. Returns True if written."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if path.exists() and path.read_bytes() == payload:
        return False
    atomic_write(path, payload)
    return True


def sync_item_files(folder: str | os.PathLike, files: Mapping[str, str], pattern: str) -> None:
    """`folder` holds exactly `files` (name -> text) among the names matching `pattern`: each written only
    when its bytes change (downstream per-item jobs keep their mtimes), the others matching removed."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_if_changed(out / name, text)
    for stale in out.glob(pattern):
        if stale.name not in files:
            stale.unlink()


def replace_folder(new: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Rename the folder `new` to `dest`. An existing `dest` is moved aside just before (to a hidden
    `.<name>.old-*` folder beside it) and removed after, so `dest` is the old folder or the new one, never a
    mix; if the second rename fails the old folder is put back. A process killed between the two renames
    leaves no `dest` and the old folder under its hidden name."""
    new, dest = Path(new), Path(dest)
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}-{os.urandom(3).hex()}")
    moved = os.path.lexists(dest)
    if moved:
        os.replace(dest, old)
    try:
        os.replace(new, dest)
    except BaseException:
        if moved and not os.path.lexists(dest):
            os.replace(old, dest)
        raise
    if moved:
        if old.is_symlink() or not old.is_dir():
            old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)
    return dest


def write_folder(path: str | os.PathLike, files: Mapping[str, bytes | str]) -> Path:
    """Replace the folder `path` by one holding exactly `files` (name -> content), never a mix of both.

    The files are written into a temp folder beside it, which `replace_folder` renames into place. A
    symlinked folder is written through (its target is replaced); a file in the way is an error. The
    folder entry is fsynced once, the files are not one by one (at thousands of small records that fsync
    was most of the cost); a crash of the machine itself right after may lose their contents, which a
    rerun rewrites."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is not a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(3).hex()}.tmp")
    tmp.mkdir()  # the mode a plain mkdir gives (the umask applies)
    try:
        for name, data in files.items():
            if "/" in name or name in ("", ".", ".."):
                raise ValueError(f"not a plain file name: {name!r}")
            (tmp / name).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return replace_folder(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when it was renamed into place


@contextlib.contextmanager
def environ(extra: Mapping[str, str]):
    """`extra` set in this process's environment for the block, then restored."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def common_prefix_length(a: list, b: list) -> int:
    """How many leading items `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def sha256_bytes(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def tree_files(path: str | os.PathLike) -> list[Path]:
    """The files of a folder in hashing order, without Snakemake's `.snakemake_timestamp` marker (written
    into directory outputs after the job, so it must not change the folder's hash)."""
    return sorted(x for x in Path(path).rglob("*") if x.is_file() and x.name != ".snakemake_timestamp")


def sha256_tree(path: str | os.PathLike) -> str:
    """Hash of a folder: sorted relative paths and file hashes (a file hashes as itself)."""
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    h = hashlib.sha256()
    for f in tree_files(p):
        h.update(f.relative_to(p).as_posix().encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest()


def run_cmd(
    cmd: list[str] | str,
    *,
    timeout: float,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    input: bytes | str | None = None,
    check: bool = False,
    umask: int = -1,
) -> subprocess.CompletedProcess:
    """Run a command with a mandatory timeout, capturing output as text. Kills the whole group on timeout.
    ``umask`` (if not -1) is the child's, instead of this process's."""
    shell = isinstance(cmd, str)
    proc = subprocess.Popen(
        cmd,
        shell=shell,
        cwd=cwd,
        env=env,
        umask=umask,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    data = input.encode() if isinstance(input, str) else input
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    res = subprocess.CompletedProcess(
        cmd, proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    )
    if check and res.returncode != 0:
        raise subprocess.CalledProcessError(res.returncode, cmd, res.stdout, res.stderr)
    return res


def retry(
    fn: Callable[[], T],
    *,
    attempts: int = 3,
    backoff: float = 1.0,
    max_backoff: float = 30.0,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    give_up_on: tuple[type[BaseException], ...] = (),
    what: str = "operation",
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call fn up to `attempts` times with exponential backoff and jitter; re-raise the last error."""
    last: BaseException | None = None
    for i in range(1, attempts + 1):
        try:
            return fn()
        except give_up_on:
            raise
        except retry_on as exc:
            last = exc
            if i == attempts:
                break
            delay = min(max_backoff, backoff * 2 ** (i - 1)) * (0.5 + random.random() / 2)
            log.warning("%s failed (attempt %d/%d): %s; retrying in %.1fs", what, i, attempts, exc, delay)
            sleep(delay)
    assert last is not None
    raise last


REDACTED = "***REDACTED***"
SECRET_ENV_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
# Token formats worth catching even when the secret is not in this process's environment.
TOKEN_PATTERNS = re.compile(
    r"(hf_[A-Za-z0-9]{20,}|sk-ant-[A-Za-z0-9_\-]{20,}|sk-[A-Za-z0-9]{32,}|e2b_[A-Za-z0-9]{20,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,})"
)
# Credentials inside a URL (scheme://user:password@host, scheme://token@host): the userinfo part goes.
URL_USERINFO = re.compile(r"(?<=://)[^\s/?#@]+@")
# Names that contain a marker (KEY, TOKEN, AUTH...) but name ordinary values in this project.
_BENIGN_KEY_WORDS = {"tokens", "tokenizer", "tokenizers", "author", "authors", "keys", "keyword", "keywords"}
_BENIGN_KEYS = re.compile(r"(^|_)(image|instance|sort|cache|dedup|group|partition|primary|join)_?key$", re.I)


def is_secret_key(name: str) -> bool:
    """Whether a variable or parameter name looks like it holds a secret (api_key, HF_TOKEN, password...);
    max_tokens, tokenizer, image_key and the like do not."""
    if _BENIGN_KEYS.search(str(name)):
        return False
    words = [w for w in re.split(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])", str(name)) if w]
    return any(
        m in w.upper() and w.lower() not in _BENIGN_KEY_WORDS for w in words for m in SECRET_ENV_MARKERS
    )


def secret_values(env: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables that look like secrets (long enough to be worth redacting)."""
    env = dict(os.environ) if env is None else env
    out = {v for k, v in env.items() if v and len(v) >= 8 and is_secret_key(k)}
    return sorted(out, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """Replace every secret value (from the environment unless given), every token-shaped string and the
    credentials of every URL."""
    for s in secret_values() if secrets is None else secrets:
        if s:
            text = text.replace(s, REDACTED)
    return URL_USERINFO.sub(REDACTED + "@", TOKEN_PATTERNS.sub(REDACTED, text))


class _RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        red = redact(msg)
        if red != msg:
            record.msg, record.args = red, None
        return True


def setup_logging(log_path: str | os.PathLike | None = None, level: int = logging.INFO) -> logging.Logger:
    """Log to stderr and optionally to a file (a rule's `log:`), redacting secrets."""
    root = logging.getLogger("sweflow")
    root.setLevel(level)
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w", encoding="utf-8"))
    for h in handlers:
        h.setFormatter(fmt)
        h.addFilter(_RedactingFilter())
        root.addHandler(h)
    root.propagate = False
    return root


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
