"""util.write_folder: a folder replaced whole, never a mix of old and new files."""

from __future__ import annotations

import pytest

from sweflow.util import write_folder


def test_the_folder_holds_exactly_the_new_files(tmp_path):
    target = tmp_path / "images"
    target.mkdir()
    (target / "stale.json").write_text("old")
    (target / "kept.json").write_text("old")
    write_folder(target, {"kept.json": "new", "added.json": b"bytes"})
    assert sorted(p.name for p in target.iterdir()) == ["added.json", "kept.json"]
    assert (target / "kept.json").read_text() == "new" and (target / "added.json").read_bytes() == b"bytes"
    assert [p.name for p in tmp_path.iterdir()] == ["images"]  # no temp or old folder left beside it


def test_a_failure_midway_leaves_the_old_folder_untouched(tmp_path):
    target = tmp_path / "images"
    target.mkdir()
    (target / "a.json").write_text("old")

    class Boom(Exception):
        pass

    class Files(dict):
        def items(self):
            yield "a.json", "new"
            raise Boom

    with pytest.raises(Boom):
        write_folder(target, Files())
    assert [p.name for p in target.iterdir()] == ["a.json"] and (target / "a.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["images"]


@pytest.mark.parametrize("name", ["../escape.json", "sub/x.json", "", ".."])
def test_names_must_be_plain_file_names(tmp_path, name):
    with pytest.raises(ValueError, match="plain file name"):
        write_folder(tmp_path / "images", {name: "x"})
    assert not (tmp_path / "images").exists() and list(tmp_path.iterdir()) == []


def test_a_missing_folder_is_created(tmp_path):
    write_folder(tmp_path / "deep" / "images", {"x.json": "1"})
    assert (tmp_path / "deep" / "images" / "x.json").read_text() == "1"


def test_a_symlinked_folder_is_written_through(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "stale.json").write_text("old")
    (tmp_path / "images").symlink_to(real)
    write_folder(tmp_path / "images", {"x.json": "1"})
    assert (tmp_path / "images").is_symlink()
    assert sorted(p.name for p in real.iterdir()) == ["x.json"]


def test_a_file_in_the_way_is_an_error(tmp_path):
    (tmp_path / "images").write_text("not a folder")
    with pytest.raises(ValueError, match="not a folder"):
        write_folder(tmp_path / "images", {"x.json": "1"})
    assert (tmp_path / "images").read_text() == "not a folder"


def test_the_folder_mode_follows_the_umask(tmp_path):
    import os

    old = os.umask(0o002)
    try:
        write_folder(tmp_path / "images", {"x.json": "1"})
    finally:
        os.umask(old)
    assert (tmp_path / "images").stat().st_mode & 0o777 == 0o775


def test_replace_folder_swaps_in_the_new_folder_and_leaves_nothing_beside(tmp_path):
    from sweflow.util import replace_folder

    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "old.txt").write_text("old")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "new.txt").write_text("new")
    replace_folder(tmp_path / "new", tmp_path / "dest")
    assert [p.name for p in (tmp_path / "dest").iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["dest"]


def test_replace_folder_puts_the_old_folder_back_when_the_new_one_cannot_move(tmp_path):
    from sweflow.util import replace_folder

    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "old.txt").write_text("old")
    with pytest.raises(FileNotFoundError):
        replace_folder(tmp_path / "missing", tmp_path / "dest")
    assert [p.name for p in (tmp_path / "dest").iterdir()] == ["old.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["dest"]
