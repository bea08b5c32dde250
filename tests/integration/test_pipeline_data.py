"""The data stage under real Snakemake against the local Hub endpoint: provenance, incremental rebuilds,
bad input. Templates are `prebuilt` here (template = image) so this checks the workflow, not image builds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweflow.offline.hub_store import HubStore
from sweflow.offline.local_hub import publish_sample, serve
from sweflow.sample import skyrl_rows, write_parquet

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PLANTED = "hf_PLANTEDsecret0123456789abcdef"


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_TOKEN": PLANTED, "SWEFLOW_TEST_API_KEY": "sk-ant-PLANTED-0123456789"}
    env["HF_HOME"] = str(workdir / ".hf")
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--workflow-profile",
        "none",
        "--cores",
        "2",
        *args,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if check and res.returncode != 0:
        raise AssertionError(f"snakemake failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
    return res


def jobs_run(res: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job that was executed, from Snakemake's log."""
    out, jobs, rule = res.stdout + res.stderr, [], None
    for line in out.splitlines():
        m = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line.strip())
        if m:
            rule = m.group(1)
            jobs.append((rule, ""))
            continue
        m = re.match(r"^wildcards: (.*)$", line.strip())
        if m and rule and jobs and jobs[-1][0] == rule and jobs[-1][1] == "":
            jobs[-1] = (rule, m.group(1))
    return jobs


def write_config(workdir: Path, url: str, **over) -> None:
    cfg = {
        "dataset": {
            "hub": {"endpoint": url},
            "splits": {
                "train": {"file": "train.parquet", "rows": 6},
                "validation": {"file": "validation.parquet", "rows": 2},
            },
        },
        "images": {"prefix": "sweflow-sample/sweb.eval.x86_64."},
        "harness": {"package": "swebench", "extra_repos": "sample"},
        "sandbox": {"provider": "docker", "prebuilt": True},
    }
    for key, value in over.items():
        section, _, name = key.partition("__")
        cfg.setdefault(section, {})[name] = value
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))


@pytest.fixture
def hub(tmp_path):
    root = tmp_path / "hub"
    publish_sample(root)
    with serve(HubStore(root)) as url:
        yield root, url


def sweflow(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sweflow.cli", *args], cwd=workdir, capture_output=True, text=True, timeout=300
    )


def test_full_run_noop_new_commit_and_param_change(tmp_path, hub):
    hub_root, url = hub
    work = tmp_path / "work"
    work.mkdir()
    write_config(work, url)

    first = snakemake(work, "data")
    rules = sorted(r for r, _ in jobs_run(first))
    # prebuilt images are their own templates: no job per image, the map comes from the image listing
    assert "build_template" not in rules
    assert {"resolve_dataset", "download", "validate_split", "list_images", "template_map", "convert"} <= set(
        rules
    )
    tmap = json.loads((work / "results/sample/template-map.json").read_text())
    assert len(tmap) == 6 + 2 and all(image == template for image, template in tmap.items())
    rev = json.loads((work / "resources/datasets/sample/revision.json").read_text())
    assert rev["sha"] == HubStore(hub_root).resolve("sweflow/calclib-sample", "main")
    train = work / "results/sample/train.jsonl"
    assert len(train.read_text().splitlines()) == 6
    first_bytes = train.read_bytes()

    # a second run does nothing
    again = snakemake(work, "data")
    assert jobs_run(again) == [] and "Nothing to be done" in again.stdout + again.stderr

    # refresh with no upstream change leaves revision.json untouched
    mtime = (work / "resources/datasets/sample/revision.json").stat().st_mtime_ns
    out = sweflow(work, "refresh", "--configfile", str(work / "config.yaml"))
    assert out.returncode == 0 and "unchanged" in out.stdout, out.stderr
    assert (work / "resources/datasets/sample/revision.json").stat().st_mtime_ns == mtime

    # the Hub publishes a new commit adding one task with a new image
    records = sorted((work / "results/sample/images").glob("*.json"))
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in records}
    new_sha = publish_sample(hub_root, extra=True)
    write_config(
        work,
        url,
        dataset__splits={
            "train": {"file": "train.parquet", "rows": 7},
            "validation": {"file": "validation.parquet", "rows": 2},
        },
    )
    # the expected row count is a param of validate_split only: re-running it is legitimate, so apply the
    # config change and the upstream change together, then check that nothing else re-ran.
    out = sweflow(work, "refresh", "--configfile", str(work / "config.yaml"))
    assert out.returncode == 0 and new_sha in out.stdout, out.stderr
    third = snakemake(work, "data")
    ran = jobs_run(third)
    assert {r for r, _ in ran} <= {
        "download",
        "validate_split",
        "list_images",
        "template_map",
        "convert",
        "data",
    }
    assert len(list((work / "results/sample/images").glob("*.json"))) == len(records) + 1
    for p in records:  # the unchanged images' records say the same (the checkpoint writes its folder anew)
        assert p.read_bytes() == before[p.name][0], f"{p.name} changed"
    assert len(train.read_text().splitlines()) == 7
    assert json.loads((work / "resources/datasets/sample/revision.json").read_text())["sha"] == new_sha

    # a changed param re-runs only its dependents (convert), byte-stable elsewhere
    write_config(
        work,
        url,
        dataset__splits={
            "train": {"file": "train.parquet", "rows": 7},
            "validation": {"file": "validation.parquet", "rows": 2},
        },
        agent__backend_options={"max_turns": 12},
    )
    fourth = snakemake(work, "data")
    assert sorted({r for r, _ in jobs_run(fourth)} - {"data"}) == ["convert"]
    assert json.loads(train.read_text().splitlines()[0])["metadata"]["backend_options"]["max_turns"] == 12

    # provenance: audit reaches the dataset sha, verify passes, then catches drift
    audit = sweflow(work, "audit", "results/sample/train.jsonl")
    assert audit.returncode == 0, audit.stderr
    assert new_sha in audit.stdout and "resolve_dataset" in audit.stdout and "download" in audit.stdout
    assert (work / "results/sample/manifest.json").exists()
    ok = sweflow(work, "verify")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = work / "results/sample/train/rows.report.json"
    report.write_text(report.read_text().replace('"rows": 7', '"rows": 8'))
    bad = sweflow(work, "verify")
    assert bad.returncode == 1 and "results/sample/train/rows.report.json" in bad.stdout

    # no secret anywhere: artifacts, logs, provenance, manifest, Snakemake metadata
    for path in work.rglob("*"):
        if path.is_file() and ".hf" not in path.parts:
            data = path.read_bytes()
            assert PLANTED.encode() not in data and b"sk-ant-PLANTED" not in data, path
    del first_bytes


def test_byte_identical_output_when_regenerated(tmp_path, hub):
    _, url = hub
    work = tmp_path / "w"
    work.mkdir()
    write_config(work, url)
    snakemake(work, "data")
    a = (work / "results/sample/validation.jsonl").read_bytes()
    snakemake(work, "data", "--forcerun", "convert")
    assert (work / "results/sample/validation.jsonl").read_bytes() == a


@pytest.mark.parametrize(
    "case, over, target, needle, absent",
    [
        (
            "revision that does not exist",
            {"dataset__revision": "no-such-branch"},
            "resources/datasets/sample/revision.json",
            "revision 'no-such-branch' does not exist",
            "resources/datasets/sample/revision.json",
        ),
        (
            "unreachable hub",
            {"dataset__hub": {"endpoint": "http://127.0.0.1:9"}},
            "resources/datasets/sample/revision.json",
            "unreachable",
            "resources/datasets/sample/revision.json",
        ),
        (
            "wrong row count",
            {"dataset__splits": {"train": {"file": "train.parquet", "rows": 293}}},
            "results/sample/train/rows.report.json",
            "has 6 rows, expected 293",
            "results/sample/train/rows.report.json",
        ),
        (
            "missing split file",
            {"dataset__splits": {"train": {"file": "nope.parquet", "rows": 6}}},
            "resources/datasets/sample/train.parquet",
            "nope.parquet",
            "resources/datasets/sample/train.parquet",
        ),
    ],
)
def test_bad_input_fails_with_one_line_and_no_partial_output(
    tmp_path, hub, case, over, target, needle, absent
):
    _, url = hub
    work = tmp_path / "w"
    work.mkdir()
    write_config(work, url, **over)
    if "dataset__hub" in over:
        cfg = yaml.safe_load((work / "config.yaml").read_text())
        cfg["dataset"]["hub"]["download_attempts"] = 1
        (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(work, target, check=False)
    assert res.returncode != 0, case
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("sweflow: ")]
    assert lines and needle in lines[0], (case, res.stderr[-2000:])
    assert not (work / absent).exists()
    assert not list(work.rglob(".*.tmp")) and not list(work.rglob("*.download"))


def test_unknown_repo_row_is_skipped_and_reported_while_the_others_convert(tmp_path, hub):
    hub_root, url = hub
    rows = skyrl_rows("train")
    rows[4]["instance"] = {**rows[4]["instance"], "repo": "acme/unknown", "instance_id": "acme__unknown-5"}
    bad = tmp_path / "bad.parquet"
    write_parquet(rows, bad)
    HubStore(hub_root).publish(
        "sweflow/calclib-sample", {"train.parquet": bad.read_bytes()}, "unknown repo row"
    )
    work = tmp_path / "w"
    work.mkdir()
    write_config(work, url)
    snakemake(work, "results/sample/train.jsonl")
    lines = (work / "results/sample/train.jsonl").read_text().splitlines()
    ids = [json.loads(line)["metadata"]["instance_id"] for line in lines]
    assert len(ids) == len(rows) - 1 and "acme__unknown-5" not in ids
    (skip,) = json.loads((work / "results/sample/train.convert.json").read_text())["skipped"]
    assert (skip["row"], skip["field"], skip["instance_id"]) == (4, "repo", "acme__unknown-5")
    assert skip["file"].endswith("train.parquet") and "acme/unknown" in skip["reason"]
