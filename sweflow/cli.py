"""The `sweflow` command: a small argparse dispatcher over library functions.

Each subcommand is an `_add_<name>(sub)` listed in SUBCOMMANDS; a SweflowError is a user error, printed on
one line with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import sweflow
from sweflow.errors import SweflowError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class _VerifyProgress:
    """verify's per-artifact callback: a progress bar on a terminal, plain lines with counts and an ETA
    elsewhere (a line per 5% of the artifacts), a line per artifact when verbose."""

    def __init__(self, stream: TextIO, verbose: bool) -> None:
        self.stream, self.verbose = stream, verbose
        self.progress: Any = None

    def __call__(self, i: int, total: int, path: str, ok: bool) -> None:
        from sweflow.progress import Progress

        if self.verbose:
            print(f"[{i}/{total}] {'ok     ' if ok else 'PROBLEM'} {path}", file=self.stream, flush=True)
            return
        if self.progress is None:
            self.progress = Progress(
                total, "verify", stream=self.stream, unit="artifact", every=max(1, total // 20)
            )
        self.progress.update(item=path, ok=ok)
        if i >= total:
            self.progress.close()


def _cmd_audit(args: argparse.Namespace) -> int:
    from sweflow.provenance import format_lineage, lineage, problems

    tree = lineage(args.path, args.root)
    if args.json:
        print(json.dumps(tree, sort_keys=True, indent=2))
    else:
        sys.stdout.write(format_lineage(tree))
    found = problems(tree)
    for line in found:
        print(line, file=sys.stdout if not args.json else sys.stderr)
    return EXIT_FAIL if found else EXIT_OK


def _add_audit(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="show the lineage of an artifact back to the dataset commit; exit 1 if a file no longer"
        " matches its record",
    )
    p.add_argument("path", help="an artifact that has a provenance record")
    p.add_argument("--root", help="folder holding .provenance/ (default: found from the cwd or the artifact)")
    p.add_argument("--json", action="store_true", help="print the lineage tree as JSON")
    p.set_defaults(func=_cmd_audit)


def _cmd_verify(args: argparse.Namespace) -> int:
    from sweflow.provenance import verify

    report = verify(args.root, args.manifest, on_item=_VerifyProgress(sys.stderr, args.verbose))
    for problem in report.problems:
        print(problem.line())
    print(report.summary())
    return EXIT_OK if report.ok else EXIT_FAIL


def _add_verify(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check every record and run-manifest entry against the files; exit 1 on any drifted, missing"
        " or unrecorded artifact",
    )
    p.add_argument("--root", default=".", help="folder holding .provenance/ (default: the cwd)")
    p.add_argument(
        "--manifest",
        help="check only the artifacts listed in this run manifest (default: every record and every"
        " results/*/manifest.json)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="one line per artifact on stderr")
    p.set_defaults(func=_cmd_verify)


def _cmd_refresh(args: argparse.Namespace) -> int:
    import os
    import time

    from sweflow.config import load_config
    from sweflow.progress import Progress
    from sweflow.provenance import write_records
    from sweflow.stages.data import resolve_dataset
    from sweflow.util import read_json

    if args.directory:
        os.chdir(args.directory)
    cfg = load_config(*args.configfile)
    ds = cfg["dataset"]
    out = f"resources/datasets/{ds['name']}/revision.json"
    before = read_json(out)["sha"] if os.path.exists(out) else None
    started = time.time()
    with Progress(2, "refresh", unit="step") as progress:
        rec = resolve_dataset(
            out,
            repo_id=ds["repo_id"],
            revision=ds["revision"],
            endpoint=ds["hub"]["endpoint"],
            offline_dir=ds["hub"]["offline_dir"],
            repo_type=ds["repo_type"],
            timeout=ds["hub"]["timeout_sec"],
        )
        progress.update(item=f"resolved {ds['repo_id']}@{ds['revision']}")
        if rec["sha"] != before:
            write_records(
                [out],
                rule="resolve_dataset",
                wildcards={"dataset": ds["name"]},
                params={k: ds[k] for k in ("repo_id", "repo_type", "revision")}
                | {"endpoint": ds["hub"]["endpoint"]},
                code=[__file__],
                dataset={"repo_id": rec["repo_id"], "revision": rec["revision"], "sha": rec["sha"]},
                started=started,
            )
        progress.update(item="recorded" if rec["sha"] != before else "unchanged")
    if rec["sha"] == before:
        print(f"{ds['repo_id']}@{ds['revision']}: unchanged ({before})")
        return EXIT_OK
    print(f"{ds['repo_id']}@{ds['revision']}: {before or '(none)'} -> {rec['sha']}")
    return EXIT_OK


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """--configfile (repeatable) and --directory, as the workflow run was given them."""
    p.add_argument(
        "--configfile",
        action="append",
        default=[],
        help="the run's config files, merged in order (none given: the embedded config/config.yaml)",
    )
    p.add_argument("--directory", "-d", help="the workflow's working directory (default: the cwd)")


def _add_refresh(sub: Any) -> None:
    p = sub.add_parser(
        "refresh",
        help="re-resolve the dataset revision; rewrites revision.json only when the commit sha moved",
    )
    _add_run_options(p)
    p.set_defaults(func=_cmd_refresh)


def _cmd_report(args: argparse.Namespace) -> int:
    import os

    from sweflow.config import load_config
    from sweflow.progress import Progress
    from sweflow.report import SECTION_READERS
    from sweflow.stages.report import report_step

    root = args.directory or "."
    cfg = load_config(*args.configfile)
    ds = cfg["dataset"]
    splits = ds["select_splits"] or list(ds["splits"])
    out = args.output or os.path.join(root, "results", ds["name"], "report.html")
    with Progress(len(SECTION_READERS), "report", unit="section") as progress:
        data = report_step(out, dataset=ds["name"], splits=splits, root=root, progress=progress)
    shown = [k for k, v in data.items() if any(v.values())]
    print(f"{out}: {', '.join(shown) or 'no artifacts found'}")
    return EXIT_OK


def _add_report(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write the self-contained HTML report (plots of data, validation, training, SWE-smith, SFT,"
        " provenance) of a workflow folder",
    )
    _add_run_options(p)
    p.add_argument("--output", "-o", help="where to write the page (default: results/<dataset>/report.html)")
    p.set_defaults(func=_cmd_report)


def _cmd_reap(args: argparse.Namespace) -> int:
    from sweflow.sandbox.ledger import reap

    report = reap(args.directory, say=print)
    return EXIT_FAIL if report.failed else EXIT_OK


def _add_reap(sub: Any) -> None:
    p = sub.add_parser(
        "reap",
        help="remove the sandboxes and build folders a killed run left behind (by their recorded ids;"
        " a running pipeline's are left alone)",
    )
    p.add_argument(
        "--directory", "-d", help="the workflow's working directory holding .sweflow/ (default: the cwd)"
    )
    p.set_defaults(func=_cmd_reap)


def _cmd_slurm_profile(args: argparse.Namespace) -> int:
    from sweflow.profiles import install_slurm_profile

    target = install_slurm_profile(
        account=args.account,
        cpu_partition=args.cpu_partition,
        gpu_partition=args.gpu_partition,
        dest=args.dest,
        force=args.force,
    )
    print(f"{target}: `snakemake --profile slurm` now uses it")
    return EXIT_OK


def _add_slurm_profile(sub: Any) -> None:
    p = sub.add_parser(
        "slurm-profile",
        help="install profiles/slurm as your named Snakemake profile `slurm`, with your account and"
        " partitions filled in",
    )
    p.add_argument("--account", required=True, help="the Slurm account jobs are charged to")
    p.add_argument("--cpu-partition", required=True, help="the partition of CPU jobs")
    p.add_argument("--gpu-partition", required=True, help="the partition of GPU jobs (training)")
    p.add_argument("--dest", help="the profile folder (default: Snakemake's user config folder/slurm)")
    p.add_argument("--force", action="store_true", help="replace a different profile installed there")
    p.set_defaults(func=_cmd_slurm_profile)


# Adding a subcommand: write `def _add_<name>(sub)` that calls `sub.add_parser(...)`, adds its arguments and
# `set_defaults(func=<handler>)`, where the handler takes the parsed args and returns an exit code; then
# append it to SUBCOMMANDS. Import heavy modules inside the handler so `sweflow --help` stays fast.
SUBCOMMANDS: list[Callable[[Any], None]] = [
    _add_audit,
    _add_verify,
    _add_refresh,
    _add_report,
    _add_reap,
    _add_slurm_profile,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sweflow", description=sweflow.__doc__)
    parser.add_argument("--version", action="version", version=f"sweflow {sweflow.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


# Raise SweflowError (or a subclass) for user errors: main() prints its one-line message and exits 2, without
# a traceback.
def main(argv: Sequence[str] | None = None) -> int:
    """Run the `sweflow` command; returns the exit code (0 ok, 1 check failed, 2 user error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except SweflowError as exc:
        print(f"sweflow {args.command}: error: {exc.one_line()}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("sweflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `sweflow audit X | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
