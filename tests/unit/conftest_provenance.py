"""A small fake lineage made of real files: revision.json -> parquet -> report -> jsonl, each with a record.

Imported explicitly by the provenance and CLI tests (not a shared conftest).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweflow.provenance import ROOT_ENV, write_records

SECRET = "hf_PLANTEDSECRET123456"
# Shaped like an Anthropic key but NOT in the environment: must be caught by its shape.
UNLISTED_SECRET = "sk-ant-api03-PLANTEDxxxxxxxxxxxxxxxxxxxxxxxx"
DATASET = {
    "repo_id": "sweflow/demo-tasks",
    "revision": "main",
    "sha": "0123456789abcdef0123456789abcdef01234567",
}

REVISION = "resources/datasets/demo/revision.json"
PARQUET = "resources/datasets/demo/train.parquet"
REPORT = "results/demo/train/rows.report.json"
JSONL = "results/demo/train.jsonl"
CONFIG = "config/config.yaml"


@dataclass
class Lineage:
    root: Path
    script: Path

    def path(self, rel: str) -> Path:
        return self.root / rel


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean working directory with a planted secret in the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ROOT_ENV, raising=False)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    return tmp_path


def build_lineage(root: Path, *, t0: float = 1_700_000_000.0) -> Lineage:
    """Write the four artifacts and their records under `root` (the cwd must be `root`)."""
    script = root / "workflow" / "scripts" / "step.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("print('a rule script')\n")
    code = [script]

    cfg = root / CONFIG
    cfg.parent.mkdir(parents=True, exist_ok=True)
    # Secret inside an input's content: only its hash may reach a record.
    cfg.write_text(f"dataset: {DATASET['repo_id']}\nhf_token: {SECRET}\n")

    rev = root / REVISION
    rev.parent.mkdir(parents=True, exist_ok=True)
    rev.write_text(json.dumps(DATASET, sort_keys=True) + "\n")
    write_records(
        [REVISION],
        rule="resolve_dataset",
        wildcards={"name": "demo"},
        params={"repo_id": DATASET["repo_id"], "revision": "main", "hf_token": SECRET},
        inputs={"config": CONFIG},
        code=code,
        log=["logs/resolve_dataset/demo.log"],
        dataset=DATASET,
        started=t0,
        ended=t0 + 1.5,
    )

    table = pa.table(
        {"instance_id": ["sweflow__calclib-1", "sweflow__calclib-2"], "repo": ["sweflow/calclib"] * 2}
    )
    pq.write_table(table, root / PARQUET)
    write_records(
        [PARQUET],
        rule="download",
        wildcards={"name": "demo", "split": "train"},
        params={
            "sha": DATASET["sha"],
            "url": f"https://huggingface.co/datasets/x?token={SECRET}",
            "env": {"HF_TOKEN": SECRET, "HF_HOME": "/cache/hf"},
            "headers": [f"Authorization: Bearer {SECRET}"],
        },
        inputs=[REVISION],
        code=code,
        started=t0 + 2,
        ended=t0 + 3,
    )

    report = root / REPORT
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps({"rows": 2, "duplicates": 0}, sort_keys=True) + "\n")
    write_records(
        [REPORT],
        rule="validate_split",
        wildcards={"name": "demo", "split": "train"},
        params={"max_tokens": 16000, "note": UNLISTED_SECRET},
        inputs={"parquet": PARQUET},
        code=code,
        started=t0 + 4,
        ended=t0 + 5,
        extra={"api_key": "not-an-env-secret-but-a-key", "rows": 2},
    )

    jsonl = root / JSONL
    jsonl.write_text('{"prompt":"one"}\n{"prompt":"two"}\n')
    write_records(
        {"jsonl": JSONL},
        rule="convert",
        wildcards={"name": "demo", "split": "train"},
        params={"max_turns": 80, "tokenizer": "Qwen/Qwen3.5-4B"},
        inputs={"parquet": PARQUET, "report": REPORT},
        code=code,
        started=t0 + 6,
        ended=t0 + 7,
    )
    return Lineage(root=root, script=script)


@pytest.fixture
def lineage_tree(env: Path) -> Lineage:
    return build_lineage(env)


def all_provenance_bytes(root: Path) -> bytes:
    """Every byte under .provenance/ plus any manifest, for grepping."""
    files = sorted((root / ".provenance").rglob("*")) + sorted(root.glob("*manifest*"))
    return b"\n".join(f.read_bytes() for f in files if f.is_file())
