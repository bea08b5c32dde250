"""One validated dataset row -> one training JSONL row (no gold patch anywhere).

The row keeps the recipe's in-sandbox evaluator (``blackbox_execute_cmds.after_agent``, which TRUSTS its
sandbox) for other trainers; sweflow grades on the host instead (``sweflow.grading.evaluate``). A row that
cannot be converted is skipped and reported; the other rows of the split convert.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import DatasetError, HarnessError
from ..schema import default
from ..util import jsonl_line
from .image_names import ImageNaming
from .sanitizer import sanitizer_command

INTEGRITY_RULES = """
Rules for this task:
- Work only inside {workdir}; the repository is already checked out at the commit to fix.
- Do not modify, add or delete test files or test configuration (tests/, test_*.py, *_test.py, conftest.py,
  pytest.ini, tox.ini, test settings in setup.cfg/pyproject.toml, sitecustomize.py, .pth files), and do not
  write code that interferes with how the tests run. Your change is graded by the project's own tests.
- Do not fetch the project, its history, its issues or any patch from the network (no git clone/fetch/pull,
  curl, wget, gh, or web tools). Solve the problem from the code in front of you.
- Make the smallest change that fixes the problem.""".strip()

GOLD_FIELDS = ("patch",)


@dataclass
class ConvertOptions:
    dataset: str
    split: str
    provider: str
    blackbox_type: str = default("agent.blackbox_type")
    agent_mode: str = default("agent.agent_mode")
    workdir: str = default("agent.backend_options.working_directory")
    sandbox_timeout_sec: int = default("sandbox.timeout_sec")
    sanitizer_timeout_sec: int = default("harness.sanitizer_timeout_sec")
    after_agent_timeout_sec: int = default("harness.after_agent_timeout_sec")
    eval_timeout_sec: int = default("harness.eval_timeout_sec")
    reward_function: str = default("harness.reward_function")
    reward_marker: str = default("harness.reward_marker")
    backend_options: dict[str, Any] = field(default_factory=dict)
    naming: ImageNaming = field(default_factory=ImageNaming)
    harness_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ConvertResult:
    lines: list[str]  # each converted row's JSONL line (serialized once, checked for the gold patch)
    skipped: list[dict[str, Any]]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The converted rows, parsed back from their lines."""
        return [json.loads(line) for line in self.lines]


def prompt_text(problem_statement: str, workdir: str) -> str:
    return problem_statement.rstrip() + "\n\n" + INTEGRITY_RULES.format(workdir=workdir) + "\n"


def convert_instance(
    inst: dict[str, Any],
    *,
    template: str,
    evaluator_cmd: str,
    opts: ConvertOptions,
    parser: str | None = None,
) -> dict[str, Any]:
    """Build the training row for one validated instance. `evaluator_cmd` comes from the harness layer;
    `parser` names the harness log parser of the row's repo (the host grades logs with it)."""
    row = _row(inst, template=template, evaluator_cmd=evaluator_cmd, opts=opts, parser=parser)
    assert_no_gold(jsonl_line(row), inst)
    return row


def _eval_type(inst: dict[str, Any]) -> dict[str, str]:
    """A fail-only row records its eval type (grading reads it); the common pass-and-fail one adds nothing."""
    kind = inst.get("eval_type")
    return {"eval_type": kind} if kind and kind != "pass_and_fail" else {}


# The row's ``blackbox_execute_cmds.after_agent`` evaluator (the official eval script plus an in-sandbox
# parser that prints a reward marker) is kept for trainers that grade the recipe's way; it TRUSTS the
# sandbox it runs in. sweflow itself never reads that marker: ``sweflow.grading.evaluate`` runs the same script
# through the provider and grades the log on the host (``metadata.harness.parser`` names the parser).
def _row(
    inst: dict[str, Any], *, template: str, evaluator_cmd: str, opts: ConvertOptions, parser: str | None
) -> dict[str, Any]:
    """The training row (convert_instance without the gold check, for callers that check its line)."""
    image = opts.naming.image_for(inst["instance_id"], inst["repo"])
    backend = {"working_directory": opts.workdir, **opts.backend_options}
    metadata = {
        "agent_mode": opts.agent_mode,
        "blackbox_type": opts.blackbox_type,
        "instance_id": inst["instance_id"],
        "repo": inst["repo"],
        "version": inst["version"],
        "base_commit": inst["base_commit"],
        "workdir": opts.workdir,
        "dataset": opts.dataset,
        "split": opts.split,
        "reward_function": opts.reward_function,
        "reward_marker": opts.reward_marker,
        "harness": {**opts.harness_info, "parser": parser, **_eval_type(inst)},
        "FAIL_TO_PASS": list(inst["FAIL_TO_PASS"]),
        "PASS_TO_PASS": list(inst["PASS_TO_PASS"]),
        "sandbox_provider": opts.provider,
        "sandbox_image": template,
        "docker_image": image,
        "sandbox_timeout_sec": opts.sandbox_timeout_sec,
        "backend_options": backend,
        "blackbox_execute_cmds": {
            "before_agent": [
                {
                    "name": "git_sanitizer",
                    "cmd": sanitizer_command(inst["base_commit"], opts.workdir),
                    "required": True,
                    "timeout": opts.sanitizer_timeout_sec,
                }
            ],
            "after_agent": [
                {
                    "name": "harness_eval",
                    "cmd": evaluator_cmd,
                    "required": True,
                    "timeout": opts.after_agent_timeout_sec,
                }
            ],
        },
    }
    return {
        "prompt": [{"role": "user", "content": prompt_text(inst["problem_statement"], opts.workdir)}],
        "label": "",
        "metadata": metadata,
    }


def assert_no_gold(line: str, inst: dict[str, Any]) -> None:
    """The gold patch must never reach a training row (the test patch lives only inside the evaluator).

    `line` is the row's JSONL text: the patch is looked for as it would appear there (its newlines and
    quotes JSON-escaped) as well as verbatim."""
    gold = (inst.get("patch") or "").strip()
    if gold and (gold in line or json.dumps(gold, ensure_ascii=False)[1:-1] in line):
        raise DatasetError("gold patch leaked into the training row", row=inst["instance_id"], field="patch")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a batch loop (restored after, even on error); also a decorator.

    Each converted row adds a few dozen containers; with the harness package's imports (pandas, datasets)
    on the heap, the full collections they trigger cost about a third of the conversion. Reference counting
    still frees what a row drops (rows and their parts hold no cycles); any cycle waits for the loop's end.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# Rows per worker below which a worker process costs more than it saves (forking, sending lines back).
MIN_ROWS_PER_WORKER = 400


@dataclass
class _Chunk:
    """What converting a contiguous run of rows gives: lines, skips, rows absent from the map."""

    lines: list[str]
    skipped: list[dict[str, Any]]
    missing: list[Any]
    harness_skips: int


@_gc_paused()
# One row does not sink the split: a valid row whose template build failed or that the harness cannot handle
# (unknown repo or version, no eval script) is skipped and listed in the convert report with file, row,
# field and reason; the other rows convert. Rows that break the schema never get here: split validation
# (``sweflow.dataset.splits``) fails the split on them, listing them all.
def convert_split(
    instances: Iterable[dict[str, Any]],
    *,
    template_map: dict[str, str],
    failed_images: dict[str, str],
    harness: Any,
    opts: ConvertOptions,
    source_file: str,
    workers: int = 1,
) -> ConvertResult:
    """Convert every instance; a row that cannot be converted is skipped and reported, the others convert.

    Skipped, each with file, row, field and reason: rows whose template build failed, and rows the harness
    cannot handle (unknown repo or version, eval script or parser not buildable). Raises BadRowsError listing
    every such row when an image is absent from both the map and the failure records (the pipeline's own
    inconsistency), or when the harness could handle no row at all (a wrong harness package, not bad rows).

    `workers` > 1 converts contiguous runs of rows in forked processes (the loaded harness is shared, not
    loaded again) and joins them in row order: the output is the same bytes as with one worker.
    """
    from .splits import BadRowsError, RowProblem

    instances = list(instances)
    args = (template_map, failed_images, harness, opts, source_file)
    n = max(1, min(int(workers), len(instances) // MIN_ROWS_PER_WORKER))
    if n == 1:
        chunks = [_convert_rows(instances, 0, *args)]
    else:
        chunks = _convert_forked(instances, n, args)
    lines = [line for c in chunks for line in c.lines]
    skipped = [s for c in chunks for s in c.skipped]
    missing = [m for c in chunks for m in c.missing]
    harness_skips = sum(c.harness_skips for c in chunks)
    total = len(instances)
    if missing:
        raise BadRowsError(missing, file=source_file, total_rows=total, what="for conversion")
    if harness_skips and not lines:
        raise BadRowsError(
            [RowProblem(s["reason"], row=s["row"], field=s["field"]) for s in skipped],
            file=source_file,
            total_rows=total,
            what="for conversion",
            note="the harness could convert no row: check harness.package and harness.extra_repos",
        )
    return ConvertResult(lines=lines, skipped=skipped)


def _convert_rows(
    instances: list[dict[str, Any]],
    offset: int,
    template_map: dict[str, str],
    failed_images: dict[str, str],
    harness: Any,
    opts: ConvertOptions,
    source_file: str,
) -> _Chunk:
    """Rows offset.. of the split: each converted, serialized once and checked, or skipped / missing."""
    from .splits import RowProblem

    lines, skipped, missing, harness_skips = [], [], [], 0
    for i, inst in enumerate(instances, start=offset):
        iid = inst["instance_id"]
        image = opts.naming.image_for(iid, inst["repo"])
        where = {"instance_id": iid, "file": source_file, "row": i}
        if image not in template_map:
            if image in failed_images:
                skipped.append(
                    {**where, "field": "sandbox_image", "image": image, "reason": failed_images[image]}
                )
            else:
                missing.append(
                    RowProblem(
                        f"image {image!r} is missing from the template map (build its template or fix images.prefix)",
                        row=i,
                        field="sandbox_image",
                    )
                )
            continue
        try:
            evaluator = harness.evaluator_command(
                inst, timeout_sec=opts.eval_timeout_sec, marker=opts.reward_marker
            )
            parser = harness.parser_for_instance(inst)  # a 5.x row names its own
        except HarnessError as exc:
            harness_skips += 1
            skipped.append({**where, "field": exc.field or "repo", "reason": f"harness: {exc.problem}"})
            continue
        row = _row(
            inst,
            template=template_map[image],
            evaluator_cmd=evaluator,
            opts=opts,
            parser=getattr(parser, "__name__", None),
        )
        line = jsonl_line(row)  # serialized once: checked here, written as is
        assert_no_gold(line, inst)
        lines.append(line)
    return _Chunk(lines, skipped, missing, harness_skips)


# What forked workers read: set just before the fork, so the harness travels by copy-on-write, not pickle.
_FORK_JOB: tuple[list[dict[str, Any]], tuple[Any, ...]] | None = None


def _forked_chunk(bounds: tuple[int, int]) -> _Chunk:
    assert _FORK_JOB is not None
    instances, args = _FORK_JOB
    start, end = bounds
    return _convert_rows(instances[start:end], start, *args)


def _convert_forked(instances: list[dict[str, Any]], n: int, args: tuple[Any, ...]) -> list[_Chunk]:
    """`n` contiguous runs of rows, the first converted here and the others in `n - 1` forked processes,
    returned in row order.

    An error in a worker (a gold patch in a row, a harness bug) is raised here with its message; a worker
    that dies (killed, out of memory) fails the step (BrokenProcessPool) instead of hanging it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    global _FORK_JOB  # one conversion at a time per process (the pipeline's convert step is one call)
    size = -(-len(instances) // n)
    bounds = [(k, min(k + size, len(instances))) for k in range(0, len(instances), size)]
    _FORK_JOB = (instances, args)
    try:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=len(bounds) - 1, mp_context=ctx) as pool:
            others = [pool.submit(_forked_chunk, b) for b in bounds[1:]]
            first = _forked_chunk(bounds[0])
            return [first, *(f.result() for f in others)]
    finally:
        _FORK_JOB = None
