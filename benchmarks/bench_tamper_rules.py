"""Benchmark: how often each tamper pattern matches ordinary code (the false positives a real fix could meet).

    .venv/bin/python benchmarks/bench_tamper_rules.py                 # this virtualenv's site-packages
    .venv/bin/python benchmarks/bench_tamper_rules.py --root DIR      # any tree of Python sources

The patch check refuses added lines of non-test files that match ``IntegrityRules.tamper_patterns``. Every
non-test, non-comment line of every ``.py`` file under the root (test runners and their plugins left out:
pytest, unittest, pluggy, coverage, xdist) is read as if a patch added it; printed per pattern: lines
matched, per 10,000 lines, packages with a match (the first few named). A pattern that matches real library
code often would refuse real fixes; the runner and introspection patterns should match next to nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweflow.grading.integrity import DEFAULT_RULES, is_test_path  # noqa: E402

RUNNERS = ("_pytest", "pytest", "unittest", "pluggy", "coverage", "xdist", "execnet", "pip", "setuptools")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(sysconfig.get_paths()["purelib"]))
    args = ap.parse_args(argv)
    pats = [(p, re.compile(p)) for p in DEFAULT_RULES.tamper_patterns]
    hits: dict[str, list] = {p: [0, set()] for p, _ in pats}
    lines_read, packages = 0, set()
    for f in sorted(args.root.rglob("*.py")):
        rel = f.relative_to(args.root).as_posix()
        top = rel.split("/")[0]
        if is_test_path(rel) or top.startswith(RUNNERS):
            continue
        packages.add(top)
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for ln in text.splitlines():
            s = ln.strip()
            if not s or s.startswith("#"):
                continue
            lines_read += 1
            for p, rx in pats:
                if rx.search(ln):
                    hits[p][0] += 1
                    hits[p][1].add(top)
    print(f"{args.root}: {len(packages)} packages, {lines_read} non-test code lines")
    print(f"{'lines':>7} {'per 10k':>8} {'pkgs':>5}  pattern  (first packages)")
    for p, (n, pk) in hits.items():
        print(f"{n:7d} {n / max(lines_read, 1) * 1e4:8.2f} {len(pk):5d}  {p}  {', '.join(sorted(pk)[:5])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
