"""A local stand-in for the Hugging Face Hub: a file-backed store of versioned repos and an HTTP endpoint for it.

`serve(store)` answers, over a `HubStore` (`sweflow.offline.hub_store`), the part of the Hub API the real
`huggingface_hub` client uses; point the client at it with `HF_ENDPOINT=<url>` or `endpoint=<url>`.
`publish_sample` and `publish_tiny_model` fill a store with the embedded sample and the tiny Qwen3 model.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from sweflow.errors import DatasetError
from sweflow.util import atomic_write, sha256_bytes

from .hub_store import EntryNotFoundError, HubStore, RepoNotFoundError, RevisionNotFoundError

SAMPLE_REPO_ID = "sweflow/calclib-sample"
TINY_MODEL_REPO_ID = "sweflow/tiny-qwen3"
# The tiny models the bundled Hub can serve: repo id -> sweflow.offline.tiny_model preset.
TINY_MODEL_REPOS = {TINY_MODEL_REPO_ID: "tiny", "sweflow/tiny-qwen3-swa": "tiny-swa"}


# ---- HTTP ---------------------------------------------------------------------------------------------
class _Reply(Exception):
    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(body.get("error", ""))
        self.status, self.body, self.headers = status, body, headers or {}


def _not_found(exc: DatasetError, headers: dict[str, str] | None = None) -> _Reply:
    code = {
        RepoNotFoundError: "RepoNotFound",
        RevisionNotFoundError: "RevisionNotFound",
        EntryNotFoundError: "EntryNotFound",
    }[type(exc)]
    return _Reply(
        404, {"error": exc.problem}, {"X-Error-Code": code, "X-Error-Message": exc.problem, **(headers or {})}
    )


def _validate_card(content: str) -> None:
    """Answer the Hub's README check: front matter (between --- lines) must parse as a YAML mapping."""
    import yaml

    m = re.match(r"^---\n(.*?)\n---\n", content, re.S)
    errors = []
    if m:
        try:
            meta = yaml.safe_load(m.group(1))
        except yaml.YAMLError as exc:
            errors.append({"message": f"invalid YAML: {exc}"})
        else:
            if meta is not None and not isinstance(meta, dict):
                errors.append({"message": "the metadata is not a mapping"})
    raise _Reply(400 if errors else 200, {"errors": errors, "warnings": []})


def _split_repo(parts: list[str], keywords: tuple[str, ...]) -> tuple[str, str, list[str]]:
    """(repo_id, keyword, rest) from path segments like [owner, name, "resolve", rev, *file]."""
    for i in (2, 1):
        if len(parts) > i and parts[i] in keywords:
            return "/".join(parts[:i]), parts[i], parts[i + 1 :]
    if 1 <= len(parts) <= 2:
        return "/".join(parts), "", []
    raise _Reply(404, {"error": "not found"})


# The subset of the Hub API that `HfApi().dataset_info/model_info/repo_info/list_repo_refs/list_repo_tree`,
# `hf_hub_download` and `snapshot_download` use, for dataset repos (`/api/datasets/...`,
# `/datasets/<repo>/resolve/...`) and model repos (`/api/models/...`, `/<repo>/resolve/...`, no prefix).
# Plain HTTP: no xet headers are sent, so the client never tries the xet path.
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sweflow-hub/1"
    store: HubStore  # set on the subclass made by serve()
    blob_base: str | None = None  # the "CDN" origin file downloads are redirected to, if any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        pass

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    # Writes (`HfApi.create_repo`, `create_commit`/`upload_folder`: preupload, then an NDJSON commit with every
    # file inline) only with the server's write token as the bearer token; a server started without one is
    # read-only.
    write_token: str | None = None

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        # the body is read whatever the answer: left unread, it would be parsed as the connection's next request
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answered(lambda: self._post(url, parts, body), head=False)

    def _post(self, url: Any, parts: list[str], body: bytes) -> None:
        token = self.write_token
        given = self.headers.get("Authorization", "")
        if not token or not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise _Reply(
                401 if not given else 403, {"error": "this endpoint takes writes with its token only"}
            )
        if parts == ["api", "repos", "create"]:
            self._create_repo(json.loads(body or b"{}"))
        if parts == ["api", "validate-yaml"]:  # a README's metadata: YAML front matter that is a mapping
            _validate_card(str(json.loads(body or b"{}").get("content") or ""))
        elif parts[:1] == ["api"] and len(parts) >= 4 and parts[1] in ("datasets", "models"):
            repo_id, keyword, rest = _split_repo(parts[2:], ("preupload", "commit"))
            if keyword == "preupload":
                files = json.loads(body or b"{}").get("files") or []
                raise _Reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                                              "oid": None} for f in files]})  # fmt: skip
            if keyword == "commit":
                self._commit(parts[1][:-1], repo_id, "/".join(rest) or "main", body)
        raise _Reply(404, {"error": f"no such endpoint {url.path}"})

    def _answered(self, route: Any, head: bool) -> None:
        """Run `route`: the _Reply it raises, or a store's not-found error, is the JSON answer."""
        try:
            route()
        except _Reply as reply:
            self._send_json(reply.status, reply.body, reply.headers, head)
        except (RepoNotFoundError, RevisionNotFoundError, EntryNotFoundError) as exc:
            reply = _not_found(exc)
            self._send_json(reply.status, reply.body, reply.headers, head)

    def _base(self) -> str:
        return f"http://{self.headers.get('Host') or '127.0.0.1'}"

    def _create_repo(self, req: dict[str, Any]) -> None:
        repo_type = str(req.get("type") or "model")
        repo_id = "/".join(x for x in (req.get("organization"), req.get("name")) if x)
        if not repo_id:
            raise _Reply(400, {"error": "no repo name"})
        url = f"{self._base()}/{'datasets/' if repo_type == 'dataset' else ''}{repo_id}"
        if self.store.exists(repo_id, repo_type):
            raise _Reply(409, {"error": "You already created this repo", "url": url})
        self.store.publish(repo_id, {}, "initial commit", repo_type=repo_type)
        raise _Reply(200, {"url": url, "name": repo_id})

    def _commit(self, repo_type: str, repo_id: str, branch: str, body: bytes) -> None:
        if not self.store.exists(repo_id, repo_type):
            raise _Reply(404, {"error": f"{repo_id} not found"}, {"X-Error-Code": "RepoNotFound"})
        message, files, delete = "", {}, []
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            value = item.get("value") or {}
            if item.get("key") == "header":
                message = str(value.get("summary") or "")
            elif item.get("key") == "file" and value.get("encoding") == "base64":
                files[value["path"]] = base64.b64decode(value["content"])
            elif item.get("key") == "deletedFile":
                delete.append(value["path"])
            else:
                raise _Reply(400, {"error": f"unsupported commit entry {item.get('key')!r}"})
        sha = self.store.publish(repo_id, files, message, branch, delete=tuple(delete), repo_type=repo_type)
        prefix = "datasets/" if repo_type == "dataset" else ""
        raise _Reply(200, {"commitUrl": f"{self._base()}/{prefix}{repo_id}/commit/{sha}", "commitOid": sha,
                           "pullRequestUrl": None})  # fmt: skip

    def _dispatch(self, head: bool) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        query = parse_qs(url.query)
        self._answered(lambda: self._get(url, parts, query, head), head)

    def _get(self, url: Any, parts: list[str], query: dict[str, list[str]], head: bool) -> None:
        if parts[:1] == ["api"] and len(parts) >= 3 and parts[1] in ("datasets", "models"):
            self._api(parts[1][:-1], parts[2:], query, head)
        elif len(parts) == 2 and parts[0] == "blobs":
            self._send_blob(parts[1], {}, head)
        elif parts[:1] == ["datasets"]:
            self._resolve("dataset", parts[1:], head)
        elif "resolve" in parts[1:3]:
            self._resolve("model", parts, head)
        else:
            raise _Reply(404, {"error": f"no such endpoint {url.path}"})

    def _send_json(self, status: int, body: Any, headers: dict[str, str], head: bool) -> None:
        data = json.dumps(body, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _api(self, repo_type: str, parts: list[str], query: dict[str, list[str]], head: bool) -> None:
        repo_id, keyword, rest = _split_repo(parts, ("revision", "refs", "tree"))
        store = self.store
        if keyword == "refs":
            refs = store.refs(repo_id, repo_type)

            def items(kind: str, prefix: str) -> list[dict[str, str]]:
                return [
                    {"name": n, "ref": prefix + n, "targetCommit": s} for n, s in sorted(refs[kind].items())
                ]

            body: Any = {
                "branches": items("branches", "refs/heads/"),
                "tags": items("tags", "refs/tags/"),
                "converts": [],
            }
        elif keyword == "tree":
            rev = rest[0] if rest else "main"
            body = self._tree(repo_id, repo_type, rev, "/".join(rest[1:]), query.get("recursive", [""])[0])
        elif keyword in ("revision", ""):
            rev = rest[0] if rest else "main"
            sha = store.resolve(repo_id, rev, repo_type)
            files = store.commit(repo_id, sha, repo_type)["files"]
            blobs = query.get("blobs", [""])[0].lower() in ("1", "true")
            siblings = [
                {"rfilename": p, **({"size": e["size"], "blobId": e["sha256"][:40]} if blobs else {})}
                for p, e in files.items()
            ]
            body = {
                "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "author": repo_id.split("/")[0] if "/" in repo_id else None,
                "sha": sha,
                "private": False,
                "gated": False,
                "disabled": False,
                "tags": [],
                "siblings": siblings,
            }
        else:
            raise _Reply(404, {"error": "not found"})
        sha = body.get("sha") if isinstance(body, dict) else None
        self._send_json(200, body, {"X-Repo-Commit": sha} if sha else {}, head)

    def _tree(
        self, repo_id: str, repo_type: str, rev: str, folder: str, recursive: str
    ) -> list[dict[str, Any]]:
        files = self.store.files(repo_id, rev, repo_type)
        prefix = folder.rstrip("/") + "/" if folder else ""
        deep = recursive.lower() in ("1", "true")
        out: dict[str, dict[str, Any]] = {}
        for path, entry in files.items():
            if not path.startswith(prefix):
                continue
            rel_parts = path[len(prefix) :].split("/")
            for depth in range(1, len(rel_parts)):
                if depth > 1 and not deep:
                    break
                d = prefix + "/".join(rel_parts[:depth])
                out.setdefault(
                    d, {"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest()}
                )
            if deep or len(rel_parts) == 1:
                out[path] = {"type": "file", "path": path, "size": entry["size"], "oid": entry["sha256"][:40]}
        if folder and not out:
            raise EntryNotFoundError(f"{folder!r} not found at {rev!r} of {repo_id!r}")
        return [out[k] for k in sorted(out)]

    def _resolve(self, repo_type: str, parts: list[str], head: bool) -> None:
        repo_id, keyword, rest = _split_repo(parts, ("resolve",))
        if keyword != "resolve" or len(rest) < 2:
            raise _Reply(404, {"error": "not found"})
        rev, filename = rest[0], "/".join(rest[1:])
        sha = self.store.resolve(repo_id, rev, repo_type)
        entry = self.store.commit(repo_id, sha, repo_type)["files"].get(filename)
        if entry is None:
            raise _not_found(EntryNotFoundError(f"{filename!r} not found at {rev!r}"), {"X-Repo-Commit": sha})
        if self.blob_base:
            # Like the Hub's LFS files: a redirect to another origin (a "CDN") that carries the file's metadata.
            headers = {
                "Location": f"{self.blob_base}/blobs/{entry['sha256']}",
                "X-Repo-Commit": sha,
                "X-Linked-Etag": f'"{entry["sha256"]}"',
                "X-Linked-Size": str(entry["size"]),
            }
            self._send_json(302, {}, headers, head)
            return
        self._send_blob(entry["sha256"], {"X-Repo-Commit": sha}, head)

    def _send_blob(self, digest: str, headers: dict[str, str], head: bool) -> None:
        path = self.store.object_path(digest)
        if not re.fullmatch(r"[0-9a-f]{64}", digest) or not path.is_file():
            raise _Reply(404, {"error": "no such blob"})
        data = path.read_bytes()
        start, end, status = 0, len(data), 200
        if (rng := self.headers.get("Range")) is not None:
            start, end = _parse_range(rng, len(data))
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{digest}"')
        for k, v in headers.items():
            self.send_header(k, v)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if not head:
            self.wfile.write(data[start:end])


def _parse_range(header: str, size: int) -> tuple[int, int]:
    """[start, end) of a single `bytes=` range; a 416 reply when it cannot be satisfied."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
    bad = _Reply(416, {"error": f"unsatisfiable range {header!r}"}, {"Content-Range": f"bytes */{size}"})
    if not m or (m.group(1) == "" and m.group(2) == ""):
        raise bad
    if m.group(1) == "":
        start, end = max(0, size - int(m.group(2))), size
    else:
        start = int(m.group(1))
        end = min(size, int(m.group(2)) + 1) if m.group(2) else size
    if start >= size or start >= end:
        raise bad
    return start, end


@contextlib.contextmanager
def _run_server(handler: type[_Handler], host: str, port: int) -> Iterator[str]:
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    # A short poll interval makes shutdown() (and so leaving the context) take milliseconds, not 0.5 s.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="sweflow-hub", daemon=True
    )
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _cdn_host(host: str) -> str:
    """A host name other than `host` that reaches the same machine (the "CDN" of the LFS redirect)."""
    if host.startswith("127."):
        # All of 127.0.0.0/8 is loopback on Linux; another address is another host to an HTTP client.
        return "127.0.0.2" if host != "127.0.0.2" else "127.0.0.3"
    return "127.0.0.1" if host in ("localhost", "0.0.0.0") else host


@contextlib.contextmanager
def serve(
    store: HubStore | str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    lfs_redirect: bool = False,
    write_token: str | None = None,
) -> Iterator[str]:
    """Serve `store` over HTTP in a background thread; yield the endpoint URL (http://host:port).

    With lfs_redirect=True, file requests answer like the Hub does for LFS files: a 302 to a second listener
    with X-Linked-Etag / X-Linked-Size. That listener has another host name (127.0.0.1 -> 127.0.0.2, another
    loopback address), as a CDN has: huggingface_hub >= 1.x follows a redirect to the same host name (any port)
    and then expects the Hub's headers on the blob reply, while it takes the metadata from the 302 itself when
    the redirect leaves the Hub's host. `write_token`: the bearer token that may create repos and commit to
    them (None: read-only).
    """
    store = store if isinstance(store, HubStore) else HubStore(store)
    with contextlib.ExitStack() as stack:
        blob_base = None
        if lfs_redirect:
            blob_handler = type("HubBlobHandler", (_Handler,), {"store": store})
            blob_base = stack.enter_context(_run_server(blob_handler, _cdn_host(host), 0))
        handler = type("HubHandler", (_Handler,), {"store": store, "blob_base": blob_base,
                                                   "write_token": write_token})  # fmt: skip
        yield stack.enter_context(_run_server(handler, host, port))


def publish_sample(
    root: str | Path, extra: bool = False, *, repo_id: str = SAMPLE_REPO_ID, shape: str = "skyrl"
) -> str:
    """Publish the sample's train/validation parquet files to `repo_id` in the store at `root`; return the sha.

    Idempotent: the base publish always yields the same sha. extra=True then adds a second commit whose train
    split has one more task (the "upstream published a new task" case).
    """
    from sweflow.sample import parquet_bytes, sample_rows, skyrl_rows

    make = skyrl_rows if shape == "skyrl" else sample_rows
    store = HubStore(root)
    files = {f"{s}.parquet": parquet_bytes(make(s)) for s in ("train", "validation")}
    if not store.exists(repo_id):
        base = store.publish(repo_id, files, "Add the calclib sample (train 6, validation 2)")
    elif (base := _base_sha(store, repo_id, files)) is None:
        raise DatasetError(f"repository {repo_id!r} exists with other content", file=str(root))
    if not extra:
        return base
    return store.publish(repo_id, {"train.parquet": parquet_bytes(make("train", extra=True))}, "Add one task")


def _base_sha(store: HubStore, repo_id: str, files: dict[str, bytes]) -> str | None:
    """The sha of the first commit of `repo_id` if it holds exactly `files`, else None."""
    sha: str | None = store.resolve(repo_id, "main")
    while sha:
        record = store.commit(repo_id, sha)
        if record["parent"] is None:
            wanted = {n: {"sha256": sha256_bytes(d), "size": len(d)} for n, d in sorted(files.items())}
            return sha if record["files"] == wanted else None
        sha = record["parent"]
    return None


def publish_tiny_model(
    root: str | Path, *, repo_id: str = TINY_MODEL_REPO_ID, preset: str | None = None
) -> str:
    """Build the tiny Qwen3 model (`sweflow.offline.tiny_model.build_tiny_model`) and publish its files as the model repo
    `repo_id` in the store at `root`; return the commit sha.

    Idempotent: the build is byte-deterministic (seeded weights, a BPE trained on a fixed corpus; checked by the
    tests), so a rerun publishes the same bytes and `HubStore.publish` returns the existing sha with no new
    commit. Files of an earlier build that this build does not write are deleted in the same commit.
    """
    import tempfile

    import torch
    import transformers

    from . import tiny_model
    from .tiny_model import build_tiny_model

    store = HubStore(root)
    preset = preset or TINY_MODEL_REPOS.get(repo_id, "tiny")
    # Building takes seconds (torch, a tokenizer trained from scratch): skip it when this store already
    # holds the build of the same code, preset and library versions.
    source = (
        Path(tiny_model.__file__).read_bytes()
        + f"|{preset}|{torch.__version__}|{transformers.__version__}".encode()
    )
    stamp = sha256_bytes(source)
    marker = Path(root) / "models" / repo_id / ".built-from"
    if store.exists(repo_id, "model") and marker.is_file() and marker.read_text().strip() == stamp:
        return store.resolve(repo_id, "main", "model")
    with tempfile.TemporaryDirectory(prefix="sweflow-tiny-publish-") as tmp:
        built = build_tiny_model(Path(tmp) / "model", preset)
        files = {
            p.relative_to(built).as_posix(): p.read_bytes() for p in sorted(built.rglob("*")) if p.is_file()
        }
    stale: tuple[str, ...] = ()
    if store.exists(repo_id, "model"):
        stale = tuple(sorted(set(store.files(repo_id, "main", "model")) - set(files)))
    sha = store.publish(repo_id, files, "Add the tiny Qwen3 model", delete=stale, repo_type="model")
    atomic_write(marker, stamp + "\n")
    return sha


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sweflow.offline.local_hub", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_serve = sub.add_parser("serve", help="serve a store over HTTP until interrupted")
    p_serve.add_argument("--root", required=True)
    p_serve.add_argument("--host", default="127.0.0.1")
    p_serve.add_argument("--port", type=int, default=0)
    p_serve.add_argument("--lfs-redirect", action="store_true", help="redirect file downloads like LFS files")
    p_pub = sub.add_parser("publish-sample", help="publish the embedded sample dataset into a store")
    p_pub.add_argument("--root", required=True)
    p_pub.add_argument("--extra", action="store_true", help="also publish the commit with one more task")
    p_model = sub.add_parser(
        "publish-tiny-model", help="publish the tiny Qwen3 model (a model repo) into a store"
    )
    p_model.add_argument("--root", required=True)
    p_model.add_argument("--repo-id", default=TINY_MODEL_REPO_ID)
    args = parser.parse_args(argv)
    if args.cmd == "publish-sample":
        print(publish_sample(args.root, extra=args.extra))
        return 0
    if args.cmd == "publish-tiny-model":
        print(publish_tiny_model(args.root, repo_id=args.repo_id))
        return 0
    with serve(HubStore(args.root), args.host, args.port, lfs_redirect=args.lfs_redirect) as url:
        print(f"serving {args.root} at {url} (HF_ENDPOINT={url})", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
