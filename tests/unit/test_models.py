"""sweflow.models.hub against the local Hub with the real huggingface_hub client: resolving a model revision,
downloading the tiny-model snapshot (manifest, loadability, idempotent rerun, atomicity on failure), the
folder check, and publish_tiny_model's idempotence."""

from __future__ import annotations

import hashlib
import json
import socket
import struct

import pytest

from sweflow.models.hub import ModelError, check_model_dir, download_model, resolve_model
from sweflow.offline import local_hub
from sweflow.offline.hub_store import HubStore
from sweflow.offline.local_hub import publish_tiny_model, serve

REPO = "sweflow/tiny-qwen3"
PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken"]


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """(store, sha) with the tiny model published once for the module (the build takes seconds)."""
    root = tmp_path_factory.mktemp("hub")
    sha = publish_tiny_model(root)
    return HubStore(root), sha


@pytest.fixture(autouse=True)
def _clean_hf_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)


@pytest.fixture
def closed_url():
    """A URL whose port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def _siblings(dest):
    return sorted(p.name for p in dest.parent.iterdir())


def test_resolve_with_a_pinned_sha_makes_no_network_call(closed_url):
    sha = "a" * 40
    rec = resolve_model(REPO, sha, endpoint=closed_url, timeout=2)
    assert rec == {"repo_id": REPO, "repo_type": "model", "revision": sha, "sha": sha, "source": closed_url}
    # The same endpoint really is unreachable: a branch needs the network and fails there.
    with pytest.raises(ModelError) as exc:
        resolve_model(REPO, "main", endpoint=closed_url, timeout=2)
    assert "train.model.endpoint" in _one_line(exc)


def test_resolve_branch_and_tag_through_the_local_hub(tiny_store):
    store, sha = tiny_store
    store.tag(REPO, "v0.1", repo_type="model")
    with serve(store) as url:
        by_branch = resolve_model(REPO, "main", endpoint=url, source="local-hub")
        by_tag = resolve_model(REPO, "v0.1", endpoint=url, source="local-hub")
    assert by_branch == {
        "repo_id": REPO,
        "repo_type": "model",
        "revision": "main",
        "sha": sha,
        "source": "local-hub",
    }
    assert by_tag["sha"] == sha and by_tag["revision"] == "v0.1"


@pytest.mark.parametrize(
    ("repo", "revision", "field"),
    [
        ("sweflow/no-such-model", "main", "train.model.repo_id"),
        (REPO, "no-such-branch", "train.model.revision"),
    ],
)
def test_resolve_unknown_repo_or_revision_is_one_line_naming_the_field(tiny_store, repo, revision, field):
    store, _ = tiny_store
    with serve(store) as url, pytest.raises(ModelError) as exc:
        resolve_model(repo, revision, endpoint=url)
    msg = _one_line(exc)
    assert field in msg and repo in msg and revision in msg


def test_download_writes_the_snapshot_and_a_manifest_that_matches_it(tiny_store, tmp_path):
    store, sha = tiny_store
    dest = tmp_path / "models" / "tiny"
    with serve(store, lfs_redirect=True) as url:
        manifest = download_model(REPO, sha, dest, endpoint=url, allow_patterns=PATTERNS, attempts=1)
    on_disk = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert not (dest / ".cache").exists()
    assert sorted(manifest["files"]) == on_disk == sorted(store.files(REPO, sha, "model"))
    for rel, entry in manifest["files"].items():
        data = (dest / rel).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert entry["sha256"] == store.files(REPO, sha, "model")[rel]["sha256"]
    assert manifest["total_bytes"] == sum((dest / rel).stat().st_size for rel in on_disk)
    assert manifest["repo_id"] == REPO and manifest["sha"] == sha
    assert check_model_dir(dest) == []
    assert _siblings(dest) == ["tiny"]  # no temporary folder left beside it

    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(dest)
    tok = AutoTokenizer.from_pretrained(dest)
    assert config.model_type == "qwen3" and config.vocab_size == len(tok)
    assert tok.decode(tok("def add(a, b):")["input_ids"]) == "def add(a, b):"


def test_rerun_gives_the_same_manifest_and_drops_stray_files(tiny_store, tmp_path):
    store, sha = tiny_store
    dest = tmp_path / "tiny"
    with serve(store) as url:
        first = download_model(REPO, sha, dest, endpoint=url, allow_patterns=PATTERNS, attempts=1)
        (dest / "stray.bin").write_bytes(b"left by hand")
        (dest / "config.json").write_text("{}")
        second = download_model(REPO, sha, dest, endpoint=url, allow_patterns=PATTERNS, attempts=1)
    assert second == first
    assert not (dest / "stray.bin").exists()
    assert json.loads((dest / "config.json").read_text())["model_type"] == "qwen3"


@pytest.mark.parametrize(
    ("repo", "sha", "field"),
    [("sweflow/no-such-model", None, "train.model.repo_id"), (REPO, "0" * 40, "train.model.revision")],
)
def test_download_unknown_repo_or_commit_is_one_line_and_leaves_nothing(
    tiny_store, tmp_path, repo, sha, field
):
    store, good = tiny_store
    sha = sha or good
    dest = tmp_path / "m"
    with serve(store) as url, pytest.raises(ModelError) as exc:
        download_model(repo, sha, dest, endpoint=url, allow_patterns=PATTERNS, attempts=3)
    msg = _one_line(exc)
    assert field in msg and repo in msg and sha in msg
    assert list(tmp_path.iterdir()) == []


def test_download_from_an_unreachable_hub_fails_after_the_retries(tiny_store, tmp_path, closed_url):
    _, sha = tiny_store
    with pytest.raises(ModelError) as exc:
        download_model(REPO, sha, tmp_path / "m", endpoint=closed_url, attempts=2, timeout=2)
    msg = _one_line(exc)
    assert "after 2 attempts" in msg and "train.model.endpoint" in msg and REPO in msg
    assert list(tmp_path.iterdir()) == []


def test_a_download_that_fails_halfway_leaves_no_destination(tmp_path):
    root = tmp_path / "hub"
    sha = HubStore(root).publish(
        REPO,
        {
            "config.json": json.dumps({"model_type": "qwen3"}),
            "tokenizer.json": "{}",
            "model.safetensors": b"x" * 64,
        },
        "weights whose blob goes missing",
        repo_type="model",
    )
    store = HubStore(root)
    weights = store.files(REPO, sha, "model")["model.safetensors"]["sha256"]
    store.object_path(weights).unlink()  # the "CDN" answers 404 for it; the other files download
    dest = tmp_path / "models" / "m"
    with serve(store, lfs_redirect=True) as url, pytest.raises(ModelError) as exc:
        download_model(REPO, sha, dest, endpoint=url, allow_patterns=PATTERNS, attempts=2, timeout=5)
    assert "train.model.endpoint" in _one_line(exc)
    assert list((tmp_path / "models").iterdir()) == []


def test_a_snapshot_without_weights_is_refused(tiny_store, tmp_path):
    store, sha = tiny_store
    dest = tmp_path / "m"
    with serve(store) as url, pytest.raises(ModelError) as exc:
        download_model(REPO, sha, dest, endpoint=url, allow_patterns=["*.json"], attempts=1)
    msg = _one_line(exc)
    assert "no weights" in msg and "train.model.revision" in msg and sha in msg
    assert list(tmp_path.iterdir()) == []


def test_download_needs_a_resolved_sha(tmp_path, closed_url):
    with pytest.raises(ModelError) as exc:
        download_model(REPO, "main", tmp_path / "m", endpoint=closed_url)
    assert "40-hex" in _one_line(exc)


def _safetensors(n_bytes: int, declared: int) -> bytes:
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [declared // 4], "data_offsets": [0, declared]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * n_bytes


def test_check_model_dir_reports_what_is_missing_or_broken(tmp_path):
    assert check_model_dir(tmp_path / "absent") == [f"{tmp_path / 'absent'} is not a folder"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (tmp_path / "model.safetensors").write_bytes(_safetensors(16, 16))
    problems = check_model_dir(tmp_path)
    assert len(problems) == 1 and problems[0].startswith("no tokenizer file")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert check_model_dir(tmp_path) == []
    short = _safetensors(8, 16)  # the header declares 16 bytes of data, 8 are there
    (tmp_path / "model.safetensors").write_bytes(short)
    assert check_model_dir(tmp_path) == [
        f"model.safetensors is truncated ({len(short)} bytes, the header needs {len(short) + 8})"
    ]
    (tmp_path / "model.safetensors").unlink()
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(_safetensors(16, 16))
    assert check_model_dir(tmp_path) == ["weight shards missing: model-00002-of-00002.safetensors"]
    (tmp_path / "config.json").write_text("{not json")
    assert check_model_dir(tmp_path)[0].startswith("config.json is not valid JSON")


def test_publish_tiny_model_is_idempotent_and_so_is_the_cli(tiny_store, capsys):
    store, sha = tiny_store
    commits = sorted((store.root / "models" / REPO / "commits").iterdir())
    # A second, separate build: the bytes (safetensors, tokenizer.json) are the same, so is the sha.
    assert local_hub.main(["publish-tiny-model", "--root", str(store.root)]) == 0
    assert capsys.readouterr().out.strip() == sha
    assert sorted((store.root / "models" / REPO / "commits").iterdir()) == commits
    assert store.resolve(REPO, "main", "model") == sha
    names = set(store.files(REPO, sha, "model"))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
