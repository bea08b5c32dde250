"""The local Hub store: deterministic commits, refs, resolution, errors; byte ranges; the sample publisher."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweflow.errors import DatasetError
from sweflow.offline.hub_store import EntryNotFoundError, HubStore, RepoNotFoundError, RevisionNotFoundError
from sweflow.offline.local_hub import _parse_range, _Reply, publish_sample
from sweflow.sample import EXTRA_ID, SPLITS


def _history(root):
    store = HubStore(root)
    a = store.publish("org/data", {"a.txt": b"one", "dir/b.bin": b"\x00\x01"}, "first")
    b = store.publish("org/data", {"a.txt": "two"}, "second")
    return store, a, b


def test_commit_shas_depend_only_on_content_message_and_parent(tmp_path):
    _, a1, b1 = _history(tmp_path / "one")
    _, a2, b2 = _history(tmp_path / "two")
    assert (a1, b1) == (a2, b2)
    assert len({a1, b1}) == 2 and all(len(s) == 40 for s in (a1, b1))
    other = HubStore(tmp_path / "three").publish(
        "org/data", {"a.txt": b"one", "dir/b.bin": b"\x00\x01"}, "other"
    )
    assert other != a1


def test_publish_overlays_the_parent_and_keeps_old_commits(tmp_path):
    store, a, b = _history(tmp_path)
    assert store.read("org/data", a, "a.txt") == b"one"
    assert store.read("org/data", "main", "a.txt") == b"two"
    assert store.read("org/data", "main", "dir/b.bin") == b"\x00\x01"
    assert store.commit("org/data", b)["parent"] == a
    c = store.publish("org/data", {}, "drop b", delete=("dir/b.bin",))
    assert sorted(store.files("org/data", c)) == ["a.txt"]
    assert sorted(store.files("org/data", b)) == ["a.txt", "dir/b.bin"]


def test_publish_without_changes_writes_no_commit(tmp_path):
    store, _, b = _history(tmp_path)
    assert store.publish("org/data", {"a.txt": b"two"}, "again") == b
    assert len(list((tmp_path / "datasets/org/data/commits").iterdir())) == 2


def test_resolve_branches_tags_and_full_shas(tmp_path):
    store, a, b = _history(tmp_path)
    assert store.tag("org/data", "v1", a) == a
    dev = store.publish("org/data", {"c.txt": b"c"}, "dev work", branch="dev")
    assert store.resolve("org/data", "main") == b
    assert store.resolve("org/data", "refs/heads/main") == b
    assert store.resolve("org/data", "v1") == a
    assert store.resolve("org/data", "refs/tags/v1") == a
    assert store.resolve("org/data", a) == a
    assert store.resolve("org/data", "dev") == dev != b
    assert store.refs("org/data") == {"branches": {"dev": dev, "main": b}, "tags": {"v1": a}}


def test_unknown_repo_revision_and_file_raise(tmp_path):
    store, _, _ = _history(tmp_path)
    with pytest.raises(RepoNotFoundError):
        store.resolve("org/missing", "main")
    with pytest.raises(RevisionNotFoundError):
        store.resolve("org/data", "nope")
    with pytest.raises(RevisionNotFoundError):
        store.resolve("org/data", "0" * 40)
    with pytest.raises(EntryNotFoundError):
        store.read("org/data", "main", "missing.txt")
    assert all(
        issubclass(e, DatasetError) for e in (RepoNotFoundError, RevisionNotFoundError, EntryNotFoundError)
    )


@pytest.mark.parametrize("bad", ["../x", "/abs", "a//b", "a/./b", ""])
def test_publish_rejects_unsafe_paths(tmp_path, bad):
    with pytest.raises(DatasetError, match="invalid file path"):
        HubStore(tmp_path).publish("org/data", {bad: b"x"}, "bad")


def test_repo_ids_are_validated(tmp_path):
    with pytest.raises(RepoNotFoundError):
        HubStore(tmp_path).publish("../escape", {"a": b"x"}, "bad")
    assert not HubStore(tmp_path).exists("a/b/c")


@pytest.mark.parametrize(
    "header,expected",
    [("bytes=0-3", (0, 4)), ("bytes=5-", (5, 10)), ("bytes=-3", (7, 10)), ("bytes=8-100", (8, 10))],
)
def test_byte_ranges(header, expected):
    assert _parse_range(header, 10) == expected


@pytest.mark.parametrize("header", ["bytes=10-", "bytes=5-2", "items=0-1", "bytes=-", "bytes=0-1,3-4"])
def test_unsatisfiable_byte_ranges(header):
    with pytest.raises(_Reply) as err:
        _parse_range(header, 10)
    assert err.value.status == 416


def test_publish_sample_is_idempotent_and_extra_adds_one_training_task(tmp_path):
    base = publish_sample(tmp_path / "a")
    assert publish_sample(tmp_path / "a") == base == publish_sample(tmp_path / "b")
    store = HubStore(tmp_path / "a")
    assert sorted(store.files("sweflow/calclib-sample", base)) == ["train.parquet", "validation.parquet"]

    extra = publish_sample(tmp_path / "a", extra=True)
    assert extra != base and store.resolve("sweflow/calclib-sample", "main") == extra
    assert publish_sample(tmp_path / "a", extra=True) == extra
    assert publish_sample(tmp_path / "a") == base  # still names the base commit

    def ids(rev, split):
        data = store.read("sweflow/calclib-sample", rev, f"{split}.parquet")
        table = pq.read_table(pa.BufferReader(data))
        return [row["instance_id"] for row in table.column("instance").to_pylist()]

    assert ids(base, "train") == list(SPLITS["train"])
    assert ids(extra, "train") == [*SPLITS["train"], EXTRA_ID]
    assert ids(extra, "validation") == ids(base, "validation") == list(SPLITS["validation"])
