"""Convert-step benchmark: the data stage's `convert` on a synthetic SWE-Gym-shaped split, against a baseline.

Prepares the convert rule's inputs the way the pipeline does (parquet, `validate_split`'s rows report,
`list_images`, one `prebuilt` build record per image (template = image), `template_map`), then times:

- the convert step as the rule runs it (scripts/convert.py's calls, with the workflow's config sections), as a
  whole process (`python -c`, imports included) with 1 worker and with `--threads` workers (the rule's default: 1),
  and in process (ms per row, one worker, plus `evaluator_command` alone);
- BASELINE, the recipe's simple converter: a loop calling the harness's `make_test_spec` once per row and
  embedding one shared parser program per repository (the same row layout, not the same bytes).

It prints the sha256 of the convert JSONL and report (paths relative to the workdir, as in the pipeline), so
a run before and after a change can be compared byte for byte. `--profile FILE` writes a cProfile of the
in-process convert.

    .venv/bin/python benchmarks/bench_convert.py --rows 2438 [--repeat 3] [--workdir DIR] [--profile FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sweflow.sample import numbered_rows, write_parquet  # noqa: E402

DATASET, SPLIT = "bench", "train"
PARQUET = f"resources/datasets/{DATASET}/{SPLIT}.parquet"
ROWS_REPORT = f"results/{DATASET}/{SPLIT}/rows.report.json"
MAP = f"results/{DATASET}/template-map.json"
FAILURES = f"results/{DATASET}/template-failures.json"
JSONL = f"results/{DATASET}/{SPLIT}.jsonl"
REPORT = f"results/{DATASET}/{SPLIT}.convert.json"
PARAMS = "bench-params.json"

# What scripts/convert.py does, with the params Snakemake would pass read from PARAMS.
CONVERT_RUNNER = """
import json, sys
from sweflow.stages.data import convert, convert_options, harness_from_config
p = json.load(open(sys.argv[1]))
h = p["harness"]
harness = harness_from_config(h["package"], h["extra_repos"], h.get("extra_parsers"))
opts = convert_options(dataset=p["dataset"], split=p["split"], provider=p["provider"], harness_cfg=h,
                       agent_cfg=p["agent"], naming_cfg=p["naming"],
                       sandbox_timeout_sec=p["sandbox_timeout_sec"], harness=harness)
convert(p["parquet"], p["map"], p["failures"], p["jsonl"], p["report"], opts=opts, harness=harness,
        shape=p["shape"], limit=p["limit"], max_problem_statement_chars=p["max_problem_statement_chars"],
        workers=int(sys.argv[2]))
"""

# BASELINE (the recipe's simple converter, not sweflow's): make_test_spec once per row, one parser program
# per repository, packed into an evaluator command of the same layout.
BASELINE_RUNNER = """
import json, shlex, sys
from sweflow.dataset.splits import load_split
from sweflow.harness.standalone import WORKDIR, expected_tests, pack
from sweflow.stages.data import harness_from_config
p = json.load(open(sys.argv[1]))
h = p["harness"]
harness = harness_from_config(h["package"], h["extra_repos"], h.get("extra_parsers"))
instances, _ = load_split(p["parquet"], split=p["split"], shape=p["shape"],
                          max_problem_statement_chars=p["max_problem_statement_chars"])
parsers = {}
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for inst in instances:
        spec = harness.make_test_spec(dict(inst))
        repo = inst["repo"]
        if repo not in parsers:
            parsers[repo] = pack(harness.standalone_parser_source(repo))
        tests = json.dumps(expected_tests(inst), sort_keys=True, separators=(",", ":"))
        cmd = (f"mkdir -p {WORKDIR} && printf '%s' '{pack(spec.eval_script)}' | base64 -d | gzip -dc > eval.sh"
               f" && printf '%s' '{parsers[repo]}' | base64 -d | gzip -dc > parser.py"
               f" && printf '%s' '{pack(tests)}' | base64 -d | gzip -dc > tests.json"
               f" && bash eval.sh > eval.log 2>&1; python3 parser.py --marker {shlex.quote(p['marker'])}")
        row = {"prompt": [{"role": "user", "content": inst["problem_statement"]}], "label": "",
               "metadata": {"instance_id": inst["instance_id"], "repo": repo, "sandbox_image": inst["instance_id"],
                            "blackbox_execute_cmds": {"after_agent": [{"name": "harness_eval", "cmd": cmd}]}}}
        out.write(json.dumps(row, sort_keys=True) + "\\n")
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


SAMPLE = {
    "images": {"prefix": "sweflow-bench/sweb.eval.x86_64."},
    "harness": {"package": "swebench", "extra_repos": "sample"},
}


def prepare(workdir: Path, rows: int | list[dict], overlay: dict | None = None) -> dict:
    """The convert rule's inputs, made by the pipeline's own stage functions; returns the runner params.
    `rows`: a count of sample rows, or the rows themselves; `overlay`: the images/harness/dataset settings
    (default: the embedded sample's harness tables)."""
    from sweflow.config import load_config
    from sweflow.stages.data import list_images, template_map, validate_split

    overlay = SAMPLE if overlay is None else overlay
    cfg_file = workdir / "config.yaml"
    dataset = {
        "name": DATASET,
        "revision": "0" * 40,
        "hub": {"endpoint": None, "offline_dir": str(workdir / "offline")},
        "splits": {SPLIT: {"file": "train.parquet", "rows": None}},
        "select_splits": [SPLIT],
        **overlay.get("dataset", {}),
    }
    raw = {"dataset": dataset, "sandbox": {"provider": "local", "prebuilt": True}}
    raw.update({k: v for k, v in overlay.items() if k != "dataset"})
    cfg_file.write_text(yaml.safe_dump(raw))
    cfg = load_config(cfg_file)
    ds = cfg["dataset"]
    (workdir / PARQUET).parent.mkdir(parents=True, exist_ok=True)
    write_parquet(numbered_rows(rows) if isinstance(rows, int) else rows, workdir / PARQUET)
    validate_split(
        workdir / PARQUET,
        workdir / ROWS_REPORT,
        split=SPLIT,
        expected_rows=None,
        shape=ds["row_shape"],
        max_problem_statement_chars=ds["max_problem_statement_chars"],
    )
    images = list_images(
        workdir / f"results/{DATASET}/images",
        workdir / f"results/{DATASET}/images.txt",
        parquets={SPLIT: str(workdir / PARQUET)},
        naming=cfg["images"],
        shape=ds["row_shape"],
        limit=ds["limit"],
        max_problem_statement_chars=ds["max_problem_statement_chars"],
    )
    records = []
    builds = workdir / f"results/{DATASET}/builds"
    builds.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(images):  # what build_template_step writes for `sandbox.prebuilt`
        rec = builds / f"{i}.json"
        provider = cfg["sandbox"]["provider"]
        rec.write_text(json.dumps({"image": image, "provider": provider, "template": image, "ok": True}))
        records.append(str(rec))
    template_map(records, workdir / MAP, workdir / FAILURES)
    params = {
        "dataset": DATASET,
        "split": SPLIT,
        "provider": cfg["sandbox"]["provider"],
        "harness": cfg["harness"],
        "agent": cfg["agent"],
        "naming": cfg["images"],
        "sandbox_timeout_sec": cfg["sandbox"]["timeout_sec"],
        "shape": ds["row_shape"],
        "limit": ds["limit"],
        "max_problem_statement_chars": ds["max_problem_statement_chars"],
        "marker": cfg["harness"].get("reward_marker", "SWEFLOW_REWARD_JSON="),
        "parquet": PARQUET,
        "map": MAP,
        "failures": FAILURES,
        "jsonl": JSONL,
        "report": REPORT,
    }
    (workdir / PARAMS).write_text(json.dumps(params, indent=2))
    return params


def whole_process(workdir: Path, repeat: int, code: str, *args: str) -> float:
    """The fastest of `repeat` runs of `python -c code args` in workdir, importing sweflow from this tree."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=workdir, env=env, capture_output=True, text=True
        )
        best = min(best, time.perf_counter() - t)
        if res.returncode != 0:
            sys.exit(f"runner failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return best


def in_process(workdir: Path, params: dict, profile: Path | None) -> tuple[float, float, int]:
    """ms per row of the convert step and of `evaluator_command` alone, in this process (harness loaded)."""
    import logging

    from sweflow.dataset.splits import load_split
    from sweflow.stages.data import convert, convert_options, harness_from_config

    h = params["harness"]
    harness = harness_from_config(h["package"], h["extra_repos"], h.get("extra_parsers"))
    opts = convert_options(
        dataset=DATASET,
        split=SPLIT,
        provider=params["provider"],
        harness_cfg=h,
        agent_cfg=params["agent"],
        naming_cfg=params["naming"],
        sandbox_timeout_sec=params["sandbox_timeout_sec"],
        harness=harness,
    )
    logging.getLogger("sweflow.stages").setLevel(logging.WARNING)  # keep the figures readable
    cwd = os.getcwd()
    os.chdir(workdir)
    try:

        def step() -> dict:
            return convert(
                PARQUET,
                MAP,
                FAILURES,
                "inproc.jsonl",
                "inproc.convert.json",
                opts=opts,
                harness=harness,
                shape=params["shape"],
                limit=params["limit"],
                max_problem_statement_chars=params["max_problem_statement_chars"],
            )

        if profile:
            import cProfile

            cProfile.runctx("step()", globals(), {"step": step}, str(profile))
        t = time.perf_counter()
        rows = step()["rows"]
        convert_ms = (time.perf_counter() - t) * 1000
        instances, _ = load_split(
            PARQUET,
            split=SPLIT,
            shape=params["shape"],
            max_problem_statement_chars=params["max_problem_statement_chars"],
        )
        t = time.perf_counter()
        for inst in instances:
            harness.evaluator_command(inst, timeout_sec=opts.eval_timeout_sec, marker=opts.reward_marker)
        eval_ms = (time.perf_counter() - t) * 1000
    finally:
        os.chdir(cwd)
    return convert_ms / max(rows, 1), eval_ms / max(len(instances), 1), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2438)
    ap.add_argument("--repeat", type=int, default=3, help="whole-process runs each; the fastest is reported")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--profile", type=Path, help="write a cProfile of the in-process convert here")
    ap.add_argument("--threads", type=int, default=1, help="the convert rule's threads (its workers)")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sweflow-bench-convert-"))
    workdir.mkdir(parents=True, exist_ok=True)
    params = prepare(workdir, args.rows)

    one_s = whole_process(workdir, args.repeat, CONVERT_RUNNER, PARAMS, "1")
    one_sha = sha256(workdir / JSONL)
    convert_s = whole_process(workdir, args.repeat, CONVERT_RUNNER, PARAMS, str(args.threads))
    baseline_s = whole_process(workdir, args.repeat, BASELINE_RUNNER, PARAMS, "baseline.jsonl")
    row_ms, eval_ms, rows = in_process(workdir, params, args.profile)
    same = sha256(workdir / "inproc.jsonl") == sha256(workdir / JSONL) == one_sha

    import sweflow

    print(f"rows={args.rows} converted={rows} workdir={workdir} sweflow={Path(sweflow.__file__).parent}")
    print(f"convert, whole process   : {one_s:8.2f} s  (fastest of {args.repeat}; 1 worker)")
    print(f"convert, whole process   : {convert_s:8.2f} s  ({args.threads} workers, the rule's threads)")
    print(
        f"BASELINE, whole process  : {baseline_s:8.2f} s  (fastest of {args.repeat}; make_test_spec per row, one parser per repo)"
    )
    print(f"convert, in process      : {row_ms:8.3f} ms/row")
    print(f"evaluator_command        : {eval_ms:8.3f} ms/row")
    print(f"convert / baseline       : {convert_s / baseline_s:8.2f} x")
    print(f"sha256 {JSONL}: {sha256(workdir / JSONL)}")
    print(f"sha256 {REPORT}: {sha256(workdir / REPORT)}")
    print(f"output identical in process, 1 worker and {args.threads}: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
