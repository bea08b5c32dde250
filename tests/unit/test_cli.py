"""The `sweflow` command: audit, verify, --version, one-line user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sweflow
from sweflow.cli import main
from sweflow.provenance import write_manifest

# Fixtures env and lineage_tree come from the explicitly imported fixture module.
try:
    from tests.unit.conftest_provenance import (  # noqa: F401
        DATASET,
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
        DATASET,
        JSONL,
        PARQUET,
        REPORT,
        REVISION,
        Lineage,
        env,
        lineage_tree,
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"sweflow {sweflow.__version__}"


def test_no_subcommand_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "audit" in capsys.readouterr().err


def test_audit_prints_lineage_to_dataset(lineage_tree: Lineage, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", JSONL]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"{JSONL}  [convert]")
    for rel in (PARQUET, REPORT, REVISION):
        assert rel in out
    assert lines[-1] == f"root: dataset {DATASET['repo_id']} @ {DATASET['revision']} sha {DATASET['sha']}"


def test_audit_json_finds_root_from_elsewhere(
    lineage_tree: Lineage, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(lineage_tree.root / "results")
    assert main(["audit", "--json", "demo/train/rows.report.json"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["path"] == REPORT and tree["rule"] == "validate_split"
    assert tree["inputs"][0]["inputs"][0]["dataset"] == DATASET


def test_audit_missing_record_is_one_line_exit_2(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "results/none.jsonl"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("sweflow audit: error: results/none.jsonl: no provenance record")


def test_verify_ok_then_drift_then_missing(lineage_tree: Lineage, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify"]) == 0
    assert capsys.readouterr().out.strip() == "verified 4 artifacts: 4 ok, 0 drifted, 0 missing, 0 unrecorded"

    report = lineage_tree.path(REPORT)
    report.write_bytes(report.read_bytes().replace(b"2", b"3", 1))
    assert main(["verify", "--root", str(lineage_tree.root)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "verified 4 artifacts: 2 ok, 1 drifted, 0 missing, 0 unrecorded"
    assert any(
        line.startswith(f"DRIFTED {REPORT}: expected ") and f".provenance/{REPORT}.json" in line
        for line in out
    )
    assert any(f"input of .provenance/{JSONL}.json" in line for line in out)

    lineage_tree.path(PARQUET).unlink()
    assert main(["verify", "-v"]) == 1
    captured = capsys.readouterr()
    assert f"MISSING {PARQUET}" in captured.out
    assert captured.out.splitlines()[-1] == "verified 4 artifacts: 1 ok, 1 drifted, 1 missing, 0 unrecorded"
    assert f"[2/4] PROBLEM {PARQUET}" in captured.err  # per-item progress lines


def test_verify_with_manifest_and_errors(lineage_tree: Lineage, capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest("run.manifest.json")
    assert main(["verify", "--manifest", "run.manifest.json"]) == 0
    Path("bad.json").write_text("{}")
    assert main(["verify", "--manifest", "bad.json"]) == 2
    assert "bad.json: field 'schema': not a sweflow manifest" in capsys.readouterr().err


def test_verify_without_records_is_a_user_error(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify"]) == 2
    assert "no provenance records" in capsys.readouterr().err


def test_console_script_runs(lineage_tree: Lineage) -> None:
    exe = Path(sys.executable).with_name("sweflow")
    if not exe.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    env = {k: v for k, v in os.environ.items() if k != "SWEFLOW_PROVENANCE_ROOT"}
    res = subprocess.run(
        [str(exe), "verify"], capture_output=True, text=True, timeout=60, cwd=lineage_tree.root, env=env
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "verified 4 artifacts: 4 ok, 0 drifted, 0 missing, 0 unrecorded"
