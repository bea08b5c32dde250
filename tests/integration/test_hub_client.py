"""The local Hub endpoint, driven by the real huggingface_hub client over loopback HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from sweflow.offline.hub_store import HubStore
from sweflow.offline.local_hub import publish_sample, serve

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

pytestmark = pytest.mark.integration
REPO = "sweflow/calclib-sample"


@pytest.fixture(params=[False, True], ids=["direct", "lfs-redirect"])
def hub(request, tmp_path, monkeypatch):
    """(store, endpoint url, cache dir) with the sample published; an empty HF_HOME and no telemetry.

    Runs each test twice: files served directly, and behind an LFS-style redirect to another origin.
    """
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    store = HubStore(tmp_path / "root")
    publish_sample(store.root)
    with serve(store, lfs_redirect=request.param) as url:
        yield store, url, tmp_path / "cache"


def _download(url, cache, filename="train.parquet", revision=None, repo=REPO):
    return hf_hub_download(
        repo, filename, repo_type="dataset", revision=revision, endpoint=url, cache_dir=cache, token=False
    )


def test_dataset_info_resolves_revisions_to_the_store_sha(hub):
    store, url, _ = hub
    api = HfApi(endpoint=url, token=False)
    sha = store.resolve(REPO, "main")
    info = api.dataset_info(REPO, revision="main")
    assert info.sha == sha and info.id == REPO
    assert sorted(s.rfilename for s in info.siblings) == ["train.parquet", "validation.parquet"]
    assert api.dataset_info(REPO, revision=sha).sha == sha
    store.tag(REPO, "v0.1")
    refs = api.list_repo_refs(REPO, repo_type="dataset")
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", sha)]
    assert [(t.ref, t.target_commit) for t in refs.tags] == [("refs/tags/v0.1", sha)]
    assert api.dataset_info(REPO, revision="v0.1").sha == sha


def test_download_by_sha_and_by_branch_is_byte_identical(hub):
    store, url, cache = hub
    sha = store.resolve(REPO, "main")
    for name in ("train.parquet", "validation.parquet"):
        by_sha = _download(url, cache, name, revision=sha)
        by_branch = _download(url, cache / "other", name, revision="main")
        expected = store.read(REPO, sha, name)
        assert open(by_sha, "rb").read() == expected == open(by_branch, "rb").read()
        assert sha in by_sha and sha in by_branch  # cached under the commit's snapshot


def test_new_publish_moves_the_branch_and_downloads_follow(hub):
    store, url, cache = hub
    api = HfApi(endpoint=url, token=False)
    old = api.dataset_info(REPO).sha
    old_bytes = open(_download(url, cache, revision="main"), "rb").read()
    new = publish_sample(store.root, extra=True)
    assert new != old and api.dataset_info(REPO, revision="main").sha == new
    new_bytes = open(_download(url, cache, revision="main"), "rb").read()
    assert new_bytes == store.read(REPO, new, "train.parquet") != old_bytes
    assert open(_download(url, cache, revision=old), "rb").read() == old_bytes  # old commits stay reachable


def test_unknown_repo_revision_and_file_raise_client_errors(hub):
    _, url, cache = hub
    api = HfApi(endpoint=url, token=False)
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info("sweflow/missing")
    with pytest.raises(RevisionNotFoundError):
        api.dataset_info(REPO, revision="no-such-branch")
    with pytest.raises(RepositoryNotFoundError):
        _download(url, cache, repo="sweflow/missing")
    with pytest.raises(RevisionNotFoundError):
        _download(url, cache, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        _download(url, cache, revision="f" * 40)
    with pytest.raises(EntryNotFoundError):
        _download(url, cache, filename="missing.parquet")


def test_snapshot_download_and_tree(hub):
    store, url, cache = hub
    folder = snapshot_download(REPO, repo_type="dataset", endpoint=url, cache_dir=cache, token=False)
    sha = store.resolve(REPO, "main")
    for name in ("train.parquet", "validation.parquet"):
        assert open(os.path.join(folder, name), "rb").read() == store.read(REPO, sha, name)
    tree = HfApi(endpoint=url, token=False).list_repo_tree(REPO, repo_type="dataset", recursive=True)
    assert {f.path: f.size for f in tree} == {n: e["size"] for n, e in store.files(REPO, sha).items()}


def test_resolve_serves_range_requests_and_hub_headers(hub):
    store, url, _ = hub
    sha = store.resolve(REPO, "main")
    data = store.read(REPO, sha, "validation.parquet")
    target = f"{url}/datasets/{REPO}/resolve/main/validation.parquet"
    head = httpx.head(target)
    assert head.headers["X-Repo-Commit"] == sha
    if head.status_code == 302:  # LFS-style: metadata on the redirect, bytes at another origin
        assert int(head.headers["X-Linked-Size"]) == len(data) and head.headers["X-Linked-Etag"].strip('"')
        assert not head.headers["Location"].startswith(url)
        target = head.headers["Location"]
    else:
        assert head.status_code == 200 and int(head.headers["Content-Length"]) == len(data)
    assert httpx.get(target).content == data
    part = httpx.get(target, headers={"Range": "bytes=4-11"})
    assert part.status_code == 206 and part.content == data[4:12]
    assert part.headers["Content-Range"] == f"bytes 4-11/{len(data)}"
    assert httpx.get(target, headers={"Range": f"bytes={len(data)}-"}).status_code == 416


def test_client_uses_hf_endpoint_from_the_environment(hub, tmp_path):
    store, url, _ = hub
    script = (
        "import json, sys\n"
        "from huggingface_hub import HfApi, hf_hub_download\n"
        f"sha = HfApi().dataset_info({REPO!r}).sha\n"
        f"path = hf_hub_download({REPO!r}, 'validation.parquet', repo_type='dataset', revision=sha)\n"
        "print(json.dumps({'sha': sha, 'path': path}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=url, HF_HUB_DISABLE_TELEMETRY="1", HF_HOME=str(tmp_path / "fresh_home"))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["sha"] == store.resolve(REPO, "main")
    assert out["path"].startswith(str(tmp_path / "fresh_home"))
    assert open(out["path"], "rb").read() == store.read(REPO, out["sha"], "validation.parquet")
