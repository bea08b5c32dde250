"""Lineage through a directory output (a checkpoint's per-item files): the item leads to the folder's record."""

from __future__ import annotations

import time

from sweflow.provenance import format_lineage, lineage, write_records


def test_file_inside_a_recorded_folder_links_to_the_folder_record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rev.json").write_text('{"sha": "abc"}\n')
    t = time.time()
    write_records(
        ["rev.json"],
        rule="resolve_dataset",
        started=t,
        dataset={"repo_id": "o/d", "revision": "main", "sha": "a" * 40},
    )
    (tmp_path / "items").mkdir()
    (tmp_path / "items" / "one.json").write_text("{}\n")
    write_records(["items"], rule="list_images", inputs=["rev.json"], started=t)
    (tmp_path / "built.json").write_text("[]\n")
    write_records(["built.json"], rule="build_template", inputs=["items/one.json"], started=t)

    tree = lineage("built.json")
    item = tree["inputs"][0]
    assert item["path"] == "items/one.json" and item["member_of"] == "items"
    assert item["inputs"][0]["rule"] == "list_images"
    assert item["inputs"][0]["inputs"][0]["rule"] == "resolve_dataset"
    text = format_lineage(tree)
    assert "(in items)" in text and "(no record)" not in text and "a" * 40 in text
