"""One validated dataset row -> one training JSONL row (no gold patch anywhere).

The row's ``blackbox_execute_cmds.after_agent`` evaluator (the official eval script plus an in-sandbox
parser that prints a reward marker) is kept for trainers that grade the recipe's way; it TRUSTS the
sandbox it runs in. sweflow itself never reads that marker: ``sweflow.grading.evaluate`` runs the same script
through the provider and grades the log on the host (``metadata.harness.parser`` names the parser).

One row does not sink the split: a valid row whose template build failed or that the harness cannot handle
(unknown repo or version, no eval script) is skipped and listed in the convert report with file, row,
field and reason; the other rows convert. Rows that break the schema never get here: split validation
(``sweflow.dataset.splits``) fails the split on them, listing them all.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import DatasetError, HarnessError
from ..util import jsonl_line
from .images import ImageNaming
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
    blackbox_type: str = "claude_code"
    agent_mode: str = "blackbox"
    workdir: str = "/testbed"
    sandbox_timeout_sec: int = 3600
    sanitizer_timeout_sec: int = 120
    after_agent_timeout_sec: int = 1260
    eval_timeout_sec: int = 1200
    reward_function: str = "swegym_fresh_eval"
    reward_marker: str = "SWEFLOW_REWARD_JSON="
    backend_options: dict[str, Any] = field(default_factory=dict)
    naming: ImageNaming = field(default_factory=ImageNaming)
    harness_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ConvertResult:
    rows: list[dict[str, Any]]
    skipped: list[dict[str, Any]]


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
        "harness": {**opts.harness_info, "parser": parser},
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
    row = {
        "prompt": [{"role": "user", "content": prompt_text(inst["problem_statement"], opts.workdir)}],
        "label": "",
        "metadata": metadata,
    }
    assert_no_gold(row, inst)
    return row


def assert_no_gold(row: dict[str, Any], inst: dict[str, Any]) -> None:
    """The gold patch must never reach a training row (the test patch lives only inside the evaluator)."""
    text = jsonl_line(row)
    gold = (inst.get("patch") or "").strip()
    if gold and gold in text:
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


@_gc_paused()
def convert_split(
    instances: Iterable[dict[str, Any]],
    *,
    template_map: dict[str, str],
    failed_images: dict[str, str],
    harness: Any,
    opts: ConvertOptions,
    source_file: str,
) -> ConvertResult:
    """Convert every instance; a row that cannot be converted is skipped and reported, the others convert.

    Skipped, each with file, row, field and reason: rows whose template build failed, and rows the harness
    cannot handle (unknown repo or version, eval script or parser not buildable). Raises BadRowsError listing
    every such row when an image is absent from both the map and the failure records (the pipeline's own
    inconsistency), or when the harness could handle no row at all (a wrong harness package, not bad rows).
    """
    from .splits import BadRowsError, RowProblem

    rows, skipped, missing, harness_skips, total = [], [], [], 0, 0
    for i, inst in enumerate(instances):
        total += 1
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
        rows.append(
            convert_instance(
                inst,
                template=template_map[image],
                evaluator_cmd=evaluator,
                opts=opts,
                parser=getattr(parser, "__name__", None),
            )
        )
    if missing:
        raise BadRowsError(missing, file=source_file, total_rows=total, what="for conversion")
    if harness_skips and not rows:
        raise BadRowsError(
            [RowProblem(s["reason"], row=s["row"], field=s["field"]) for s in skipped],
            file=source_file,
            total_rows=total,
            what="for conversion",
            note="the harness could convert no row: check harness.package and harness.extra_repos",
        )
    return ConvertResult(rows=rows, skipped=skipped)


def rows_to_jsonl(rows: Iterable[dict[str, Any]]) -> str:
    return "".join(jsonl_line(r) for r in rows)
