"""Provenance records, manifest, lineage and verification on a small lineage of real files."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sweflow.errors import ProvenanceError
from sweflow.provenance import (
    file_state,
    format_lineage,
    git_state,
    lineage,
    load_record,
    record_path,
    record_snakemake,
    redact_value,
    verify,
    write_manifest,
    write_records,
)
from sweflow.util import sha256_file, sha256_tree

# The fixture module is imported explicitly (its fixtures: env, lineage_tree); the fallback covers pytest's
# default import mode without a rootdir conftest, where tests/unit itself is on sys.path.
try:
    from tests.unit.conftest_provenance import (  # noqa: F401
        CONFIG,
        DATASET,
        JSONL,
        PARQUET,
        REPORT,
        REVISION,
        SECRET,
        UNLISTED_SECRET,
        Lineage,
        all_provenance_bytes,
        build_lineage,
        env,
        lineage_tree,
    )
except ModuleNotFoundError:  # pragma: no cover
    from conftest_provenance import (  # type: ignore[no-redef]  # noqa: F401
        CONFIG,
        DATASET,
        JSONL,
        PARQUET,
        REPORT,
        REVISION,
        SECRET,
        UNLISTED_SECRET,
        Lineage,
        all_provenance_bytes,
        build_lineage,
        env,
        lineage_tree,
    )


def _flip_one_byte(path: Path, offset: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_record_lives_in_parallel_tree_and_describes_artifact(lineage_tree: Lineage) -> None:
    root = lineage_tree.root
    rp = record_path(PARQUET)
    assert rp == root / ".provenance" / (PARQUET + ".json")
    rec = json.loads(rp.read_text())
    assert rec["artifact"] == {
        "path": PARQUET,
        "kind": "file",
        "sha256": sha256_file(root / PARQUET),
        "size": (root / PARQUET).stat().st_size,
    }
    assert rec["rule"] == "download"
    assert rec["wildcards"] == {"name": "demo", "split": "train"}
    (inp,) = rec["inputs"]
    assert inp["path"] == REVISION
    assert inp["sha256"] == sha256_file(root / REVISION)
    assert inp["record"] == f".provenance/{REVISION}.json"
    assert rec["code"]["scripts"] == [
        {"path": "workflow/scripts/step.py", "sha256": sha256_file(lineage_tree.script)}
    ]
    assert len(rec["code"]["sweflow_tree_sha256"]) == 64
    assert rec["software"]["python"].count(".") == 2
    assert "pyarrow" in rec["software"] and "snakemake" in rec["software"]
    assert rec["started"].startswith("2023-11-14T22:13:22") and rec["duration_s"] == 1.0
    assert rec["host"]
    assert rec["slurm"] is None  # made outside Slurm (tests/integration/test_slurm.py: the job's fields)


def test_every_record_names_the_dataset_sha(lineage_tree: Lineage) -> None:
    for rel in (REVISION, PARQUET, REPORT, JSONL):
        rec = load_record(rel)
        assert rec["dataset"] == DATASET, rel
    assert load_record(REVISION)["dataset_origin"] == "declared"
    assert load_record(JSONL)["dataset_origin"] == "inherited"
    # An input without a record (the config file) contributes no dataset and has record None.
    cfg = [i for i in load_record(REVISION)["inputs"] if i["path"] == CONFIG]
    assert cfg and cfg[0]["record"] is None


def test_lineage_walks_back_to_the_dataset(lineage_tree: Lineage) -> None:
    tree = lineage(JSONL)
    assert tree["rule"] == "convert"
    by_path = {c["path"]: c for c in tree["inputs"]}
    assert set(by_path) == {PARQUET, REPORT}
    # The parquet is reached twice (directly and via the report): shown once in full, then as a repeat.
    report_parquet = by_path[REPORT]["inputs"][0]
    assert report_parquet["path"] == PARQUET
    assert [by_path[PARQUET]["repeat"], report_parquet["repeat"]].count(True) == 1
    full = by_path[PARQUET] if not by_path[PARQUET]["repeat"] else report_parquet
    (rev,) = full["inputs"]
    assert rev["rule"] == "resolve_dataset"
    assert rev["dataset"] == DATASET
    text = format_lineage(tree)
    assert f"dataset {DATASET['repo_id']} @ main sha {DATASET['sha']}" in text
    assert text.splitlines()[0].startswith(f"{JSONL}  [convert]  {sha256_file(JSONL)[:12]}")
    assert "max_turns=80" in text and "(no record)" in text


def test_lineage_of_unrecorded_artifact_names_it(lineage_tree: Lineage) -> None:
    with pytest.raises(ProvenanceError, match="results/nope.json: no provenance record"):
        lineage("results/nope.json")


def test_verify_passes_then_names_a_modified_middle_artifact(lineage_tree: Lineage) -> None:
    ok = verify(".")
    assert ok.ok and ok.checked == 4
    assert ok.summary() == "verified 4 artifacts: 4 ok, 0 drifted, 0 missing, 0 unrecorded"

    before = sha256_file(PARQUET)
    _flip_one_byte(lineage_tree.path(PARQUET))
    report = verify(".")
    assert not report.ok
    assert report.drifted == [PARQUET]
    roles = {(p.role, p.record) for p in report.problems}
    assert roles == {
        ("artifact", f".provenance/{PARQUET}.json"),
        ("input", f".provenance/{REPORT}.json"),
        ("input", f".provenance/{JSONL}.json"),
    }
    p = report.problems[0]
    assert p.expected == before and p.actual == sha256_file(PARQUET)
    assert PARQUET in p.line() and before[:12] in p.line()
    # Only the revision is fully consistent: the report and the jsonl were made from the old parquet.
    assert report.summary() == "verified 4 artifacts: 1 ok, 1 drifted, 0 missing, 0 unrecorded"


def test_verify_reports_a_deleted_artifact_as_missing(lineage_tree: Lineage) -> None:
    lineage_tree.path(REPORT).unlink()
    report = verify(".")
    assert report.missing == [REPORT] and report.drifted == []
    assert {p.role for p in report.problems} == {"artifact", "input"}
    assert report.summary() == "verified 4 artifacts: 2 ok, 0 drifted, 1 missing, 0 unrecorded"


def test_verify_against_manifest(lineage_tree: Lineage) -> None:
    write_manifest("manifest.json")
    assert verify(".", "manifest.json").ok
    _flip_one_byte(lineage_tree.path(JSONL), 2)
    assert verify(".", "manifest.json").drifted == [JSONL]
    # A record rewritten after the manifest disagrees with the manifest row.
    write_records([JSONL], rule="convert", code=[], started=time.time())
    rep = verify(".", "manifest.json")
    # The file matches its new record; what is wrong is that the record no longer matches the manifest.
    assert [(p.kind, p.role, p.path, p.record) for p in rep.problems] == [
        ("drifted", "record", JSONL, "manifest.json")
    ]
    line = next(p.line() for p in rep.problems if p.role == "record")
    assert line.startswith(f"DRIFTED {JSONL}: manifest.json says ") and "its record says" in line


def test_no_secret_reaches_records_or_manifest(lineage_tree: Lineage) -> None:
    write_manifest("manifest.json")
    blob = all_provenance_bytes(lineage_tree.root)
    assert SECRET.encode() not in blob
    assert b"PLANTEDSECRET" not in blob
    assert UNLISTED_SECRET.encode() not in blob
    assert b"not-an-env-secret-but-a-key" not in blob
    # Redaction keeps the shape of what was there and keeps harmless values.
    download = load_record(PARQUET)["params"]
    assert download["env"]["HF_HOME"] == "/cache/hf" and download["env"]["HF_TOKEN"] == "***REDACTED***"
    assert download["url"] == "https://huggingface.co/datasets/x?token=***REDACTED***"
    assert load_record(REPORT)["params"]["max_tokens"] == 16000
    assert load_record(REPORT)["extra"] == {"api_key": "***REDACTED***", "rows": 2}
    # The secret-bearing input is still hashed faithfully.
    cfg = next(i for i in load_record(REVISION)["inputs"] if i["path"] == CONFIG)
    assert cfg["sha256"] == sha256_file(CONFIG) and SECRET in Path(CONFIG).read_text()


def test_redact_value_by_key_and_by_value() -> None:
    secrets = ["s3cr3t-value-xyz"]
    red = redact_value(
        {
            "api_key": "abc",
            "ANTHROPIC_AUTH_TOKEN": "abc",
            "image_key": "sweflow_s_calclib-1",
            "max_tokens": 16000,
            "tokenizer": "Qwen/Qwen3.5-4B",
            "nested": {"password": ["a"], "cmd": "curl -H 's3cr3t-value-xyz'"},
            "path": Path("/x/y"),
            "ids": {2, 1},
        },
        secrets,
    )
    assert red == {
        "api_key": "***REDACTED***",
        "ANTHROPIC_AUTH_TOKEN": "***REDACTED***",
        "image_key": "sweflow_s_calclib-1",
        "max_tokens": 16000,
        "tokenizer": "Qwen/Qwen3.5-4B",
        "nested": {"password": "***REDACTED***", "cmd": "curl -H '***REDACTED***'"},
        "path": "/x/y",
        "ids": [1, 2],
    }


def test_manifest_identical_across_identical_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    manifests, records = [], []
    for i, name in enumerate(("run1", "run2")):
        root = tmp_path / name
        root.mkdir()
        monkeypatch.chdir(root)
        build_lineage(root, t0=1_700_000_000.0 + 1000 * i)
        write_manifest("manifest.json")
        manifests.append((root / "manifest.json").read_bytes())
        records.append((root / ".provenance" / (JSONL + ".json")).read_bytes())
    assert manifests[0] == manifests[1]
    assert records[0] != records[1]  # the timestamps differ in the records
    doc = json.loads(manifests[0])
    assert [a["path"] for a in doc["artifacts"]] == sorted([REVISION, PARQUET, REPORT, JSONL])
    assert all(a["dataset_shas"] == [DATASET["sha"]] for a in doc["artifacts"])
    assert doc["datasets"] == [DATASET]
    assert b"started" not in manifests[0] and b"2023-" not in manifests[0]


def test_manifest_leaves_out_vanished_artifacts_and_keeps_mtime(lineage_tree: Lineage) -> None:
    out = write_manifest("manifest.json")
    mtime = out.stat().st_mtime_ns
    time.sleep(0.01)
    write_manifest("manifest.json")
    assert out.stat().st_mtime_ns == mtime
    lineage_tree.path(REPORT).unlink()  # e.g. a Snakemake temp() output
    write_manifest("manifest.json")
    paths = [a["path"] for a in json.loads(out.read_text())["artifacts"]]
    assert REPORT not in paths and len(paths) == 3


def test_directory_artifact(env: Path) -> None:
    d = env / "results" / "images"
    (d / "sub").mkdir(parents=True)
    (d / "a.json").write_text("{}\n")
    (d / "sub" / "b.json").write_text('{"b":1}\n')
    (rp,) = write_records([d], rule="list_images", inputs=[], code=[], started=time.time())
    art = json.loads(rp.read_text())["artifact"]
    assert rp == env / ".provenance" / "results" / "images.json"
    assert art == {"path": "results/images", "kind": "dir", "sha256": sha256_tree(d), "size": 11}
    assert verify(".").ok
    (d / "sub" / "b.json").write_text('{"b":2}\n')
    assert verify(".").drifted == ["results/images"]


def test_missing_output_and_outside_root_are_errors(
    env: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with pytest.raises(ProvenanceError, match="absent.txt: output does not exist"):
        write_records(["absent.txt"], rule="r", code=[], started=0.0)
    outside = tmp_path_factory.mktemp("elsewhere") / "x.txt"
    outside.write_text("x")
    with pytest.raises(ProvenanceError, match="outside the provenance root"):
        write_records([outside], rule="r", code=[], started=0.0)
    with pytest.raises(ProvenanceError, match="dataset is missing sha"):
        Path("y.txt").write_text("y")
        write_records(
            ["y.txt"], rule="r", code=[], started=0.0, dataset={"repo_id": "a/b", "revision": "main"}
        )
    assert file_state("absent.txt") is None


def test_inputs_from_two_datasets_are_both_kept(env: Path) -> None:
    for name, sha in (("a", "1" * 40), ("b", "2" * 40)):
        Path(f"{name}.json").write_text(name)
        write_records(
            [f"{name}.json"],
            rule="resolve_dataset",
            code=[],
            started=0.0,
            dataset={"repo_id": f"o/{name}", "revision": "main", "sha": sha},
        )
    Path("mix.jsonl").write_text("m")
    write_records(["mix.jsonl"], rule="mix", inputs=["a.json", "b.json"], code=[], started=0.0)
    rec = load_record("mix.jsonl")
    assert rec["dataset"] is None
    assert [d["sha"] for d in rec["datasets"]] == ["1" * 40, "2" * 40]


def test_record_snakemake_reads_the_job(env: Path) -> None:
    from snakemake.iocontainers import Namedlist

    Path("in.txt").write_text("i")
    Path("out.txt").write_text("o")
    smk = type("Smk", (), {})()
    smk.rule = "convert"
    smk.input = Namedlist(fromdict={"rows": "in.txt"})
    smk.output = Namedlist(toclone=["out.txt"])
    smk.params = Namedlist(fromdict={"max_turns": 80, "api_key": "zzz"})
    smk.wildcards = Namedlist(fromdict={"split": "train"})
    smk.log = Namedlist(toclone=["logs/x.log"])
    (rp,) = record_snakemake(smk, code=[], started=0.0)
    rec = json.loads(rp.read_text())
    assert rec["rule"] == "convert" and rec["wildcards"] == {"split": "train"}
    assert rec["params"] == {"max_turns": 80, "api_key": "***REDACTED***"}
    assert [(i["name"], i["path"]) for i in rec["inputs"]] == [("rows", "in.txt")]
    assert rec["log"] == ["logs/x.log"]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        check=True,
        capture_output=True,
        timeout=30,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_commit_and_dirty_flag(env: Path) -> None:
    repo = env / "checkout"
    (repo / "scripts").mkdir(parents=True)
    script = repo / "scripts" / "step.py"
    script.write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "scripts/step.py")
    _git(repo, "commit", "-q", "-m", "init")
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
    ).stdout.strip()
    Path("o.txt").write_text("o")
    (repo / "untracked-result.txt").write_text("results do not make the checkout dirty")
    write_records(["o.txt"], rule="r", code=[script], started=0.0)
    assert load_record("o.txt")["code"]["git"] == {"commit": head, "dirty": False}
    script.write_text("x = 2\n")
    write_records(["o.txt"], rule="r", code=[script], started=0.0)
    assert load_record("o.txt")["code"]["git"] == {"commit": head, "dirty": True}
    (env / "not-a-checkout").mkdir()
    assert git_state(env / "not-a-checkout") is None


def test_git_absent_gives_null(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(env / "empty-bin"))
    assert git_state(env) is None
    Path("o.txt").write_text("o")
    write_records(["o.txt"], rule="r", code=[env], started=0.0)
    assert load_record("o.txt")["code"]["git"] is None
