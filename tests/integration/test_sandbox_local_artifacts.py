"""The sweflow wheel build: reproducible bytes and a rebuild only when sources change."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from sweflow.sandbox.artifacts import build_wheel, default_source_root

pytestmark = pytest.mark.integration


def test_wheel_is_reproducible_and_cached(tmp_path):
    src = tmp_path / "src"
    root = default_source_root()
    shutil.copytree(root / "sweflow", src / "sweflow", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(root / "pyproject.toml", src / "pyproject.toml")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    wa = build_wheel(a, source_root=src)
    wb = build_wheel(b, source_root=src)
    assert wa == wb, "same sources, same wheel bytes"
    assert (a / wa["path"]).is_file() and wa["path"].startswith("sweflow-")
    mtime = (a / wa["path"]).stat().st_mtime_ns
    assert build_wheel(a, source_root=src, cached=wa) == wa
    assert (a / wa["path"]).stat().st_mtime_ns == mtime, "unchanged sources: not rebuilt"
    (src / "sweflow" / "extra_module.py").write_text("X = 1\n")
    assert build_wheel(a, source_root=src, cached=wa) == wa, "outside the runtime: not rebuilt"
    (src / "sweflow" / "blackbox" / "extra_module.py").write_text("X = 1\n")
    wc = build_wheel(a, source_root=src, cached=wa)
    assert wc["source_sha256"] != wa["source_sha256"] and wc["sha256"] != wa["sha256"]
    assert sorted(p.name for p in Path(a).glob("*.whl")) == [wc["path"]]
    with zipfile.ZipFile(a / wc["path"]) as zf:
        names = zf.namelist()
    assert "sweflow/blackbox/server.py" in names and "sweflow/blackbox/extra_module.py" in names
    assert not any(n.startswith(("sweflow/proxy/", "sweflow/sample/", "sweflow/stages/")) for n in names)
