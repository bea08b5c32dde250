"""Benchmark: build + smoke N templates with 1, 2 and 4 parallel workers (threads).

    .venv/bin/python benchmarks/bench_templates.py --provider local --n 4
    .venv/bin/python benchmarks/bench_templates.py --provider docker --n 4 --claude-version 2.1.332

Every template gets a distinct spec (an env marker per round and item) so each build is real; the Docker
provider builds without the layer cache. Prints seconds per template and the speed-up over one worker.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sweflow.sample import materialize_repo, sample_rows
from sweflow.sandbox.build import build_template
from sweflow.sandbox.smoke import smoke
from sweflow.sandbox.spec import TemplateSpec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", choices=["local", "docker"], default="local")
    ap.add_argument("--n", type=int, default=4, help="templates per round")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--claude-version", default=None, help="docker: bake this Claude Code version in")
    ap.add_argument("--keep", action="store_true", help="docker: keep the benchmark images")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="sweflow-bench-"))
    repo = materialize_repo(tmp / "calclib").path
    row = sample_rows("train")[0]
    claude = wheel = None
    if args.provider == "docker":
        from sweflow.sandbox.artifacts import artifact_paths, prepare_artifacts
        from sweflow.sandbox.docker import DockerProvider
        from sweflow.sandbox.images import build_base_image, build_sample_images, cache_dir

        build_base_image()
        [image] = build_sample_images([row], repo_path=repo)
        if args.claude_version:
            art = cache_dir().parent / "artifacts" / args.claude_version
            paths = artifact_paths(art, prepare_artifacts(art, args.claude_version))
            claude = paths["claude"]
        else:
            from sweflow.sandbox.artifacts import build_wheel

            (tmp / "wheel").mkdir()
            info = build_wheel(tmp / "wheel")
            paths = {"wheel": tmp / "wheel" / info["path"]}
        wheel = paths["wheel"]
        provider = DockerProvider(build_cache=False)
        source: dict = {}
    else:
        from sweflow.sandbox.local import LocalProvider

        image = f"sweflow-sample/{row['instance_id']}:latest"
        provider = LocalProvider(tmp / "templates")
        source = {"repo": repo, "commit": row["base_commit"]}
        # Warm the shared venvs once so every round measures the per-template work only.
        build_template(
            provider, image, spec=TemplateSpec(image=image), name="bench-warm", attempts=1, **source
        )

    built: list[str] = []

    def one(workers: int, i: int) -> float:
        t0 = time.monotonic()
        name = f"sweflow-bench-w{workers}-{i}"
        spec = TemplateSpec(image=image, claude_binary=claude, runtime_wheel=wheel,
                            env=(("SWEFLOW_BENCH", f"{workers}-{i}-{time.time_ns()}"),))  # fmt: skip
        build_template(provider, image, spec=spec, name=name, attempts=1, **source)
        built.append(name)
        smoke(provider, name)
        return time.monotonic() - t0

    base = None
    print(f"provider={args.provider} n={args.n}")
    print(f"{'workers':>7} {'wall_s':>8} {'s/template':>10} {'mean_job_s':>10} {'speedup':>7}")
    for workers in [int(w) for w in args.workers.split(",")]:
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(workers) as ex:
            jobs = list(ex.map(lambda i, w=workers: one(w, i), range(args.n)))
        wall = time.monotonic() - t0
        base = base or wall
        print(
            f"{workers:>7} {wall:>8.2f} {wall / args.n:>10.2f} {sum(jobs) / len(jobs):>10.2f} {base / wall:>7.2f}"
        )
        sys.stdout.flush()
    if args.provider == "docker" and not args.keep:
        subprocess.run(["docker", "rmi", "-f", *built], capture_output=True, timeout=300)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
