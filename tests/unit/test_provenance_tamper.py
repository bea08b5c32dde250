"""verify and audit are not fooled by an altered artifact whose provenance record was deleted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweflow.cli import main
from sweflow.provenance import record_path, verify, write_manifest
from sweflow.util import sha256_file

try:
    from tests.unit.conftest_provenance import (  # noqa: F401
        JSONL,
        PARQUET,
        REPORT,
        REVISION,
        Lineage,
        env,
        lineage_tree,
    )
except ModuleNotFoundError:  # pragma: no cover
    from conftest_provenance import (  # type: ignore[no-redef]  # noqa: F401
        JSONL,
        PARQUET,
        REPORT,
        REVISION,
        Lineage,
        env,
        lineage_tree,
    )

MANIFEST = "results/demo/manifest.json"  # where the Snakefile's onsuccess writes it


@pytest.fixture
def run(lineage_tree: Lineage) -> Lineage:
    """The lineage after a successful run: records plus the run manifest."""
    write_manifest(MANIFEST)
    return lineage_tree


def _alter(path: Path) -> None:
    path.write_text(path.read_text().replace("two", "TWO").replace("2", "3", 1))


def test_intact_run_verifies_and_audits_clean(run: Lineage, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["verified 4 artifacts: 4 ok, 0 drifted, 0 missing, 0 unrecorded"]
    assert main(["audit", JSONL]) == 0
    text = capsys.readouterr().out
    assert "FILE CHANGED" not in text and "DRIFTED" not in text


def test_altered_leaf_with_deleted_record_fails_verify(
    run: Lineage, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = sha256_file(JSONL)
    _alter(run.path(JSONL))
    record_path(JSONL).unlink()  # nothing points at the jsonl's record but the manifest
    report = verify(".")
    assert report.unrecorded == [JSONL] and report.drifted == [JSONL] and report.missing == []
    assert main(["verify"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"UNRECORDED {JSONL}: listed in {MANIFEST}, but its record .provenance/{JSONL}.json is gone",
        f"DRIFTED {JSONL}: expected {listed[:12]}, actual {sha256_file(JSONL)[:12]} (listed in {MANIFEST})",
        "verified 4 artifacts: 3 ok, 1 drifted, 0 missing, 1 unrecorded",
    ]


def test_deleted_record_of_a_middle_artifact_is_found_through_its_consumers(
    lineage_tree: Lineage, capsys: pytest.CaptureFixture[str]
) -> None:
    # No manifest at all: the downstream records still say the report had a record.
    _alter(lineage_tree.path(REPORT))
    record_path(REPORT).unlink()
    assert main(["verify"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "verified 3 artifacts: 2 ok, 1 drifted, 0 missing, 1 unrecorded"
    assert (
        f"UNRECORDED {REPORT}: its record .provenance/{REPORT}.json is gone (input of .provenance/{JSONL}.json)"
        in out
    )
    assert any(
        line.startswith(f"DRIFTED {REPORT}: expected ") and f"input of .provenance/{JSONL}.json" in line
        for line in out
    )
    assert len(out) == 3  # one line per problem, then the summary


def test_manifest_entry_whose_file_and_record_are_gone_is_missing(run: Lineage) -> None:
    listed = sha256_file(JSONL)
    run.path(JSONL).unlink()
    record_path(JSONL).unlink()
    report = verify(".")
    assert report.missing == [JSONL] and report.unrecorded == []
    assert [p.line() for p in report.problems] == [
        f"MISSING {JSONL} (expected {listed[:12]}; listed in {MANIFEST})"
    ]


def test_record_whose_artifact_is_gone_is_missing(run: Lineage) -> None:
    run.path(JSONL).unlink()
    report = verify(".")
    assert report.missing == [JSONL]
    assert report.summary() == "verified 4 artifacts: 3 ok, 0 drifted, 1 missing, 0 unrecorded"


def test_audit_says_an_altered_file_no_longer_matches(
    run: Lineage, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = sha256_file(PARQUET)
    data = bytearray(run.path(PARQUET).read_bytes())
    data[10] ^= 1
    run.path(PARQUET).write_bytes(bytes(data))
    assert main(["audit", JSONL]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        f"DRIFTED {PARQUET}: the file no longer matches its record .provenance/{PARQUET}.json"
        f" (record {recorded[:12]}, file {sha256_file(PARQUET)[:12]})"
    )
    assert any(line.strip("│├└─ ").startswith(PARQUET) and "FILE CHANGED: now" in line for line in out)
    assert main(["audit", "--json", PARQUET]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["current_sha256"] == sha256_file(PARQUET)
    assert captured.err.startswith(f"DRIFTED {PARQUET}")


def test_audit_of_altered_file_with_deleted_record(run: Lineage, capsys: pytest.CaptureFixture[str]) -> None:
    _alter(run.path(JSONL))
    record_path(JSONL).unlink()
    assert main(["audit", JSONL]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith(f"sweflow audit: error: {JSONL}: no provenance record")
    assert f"{MANIFEST} lists it with sha256" in err and "the file no longer matches it" in err
