"""Grading on the host: the eval script runs in the sandbox, the verdict is computed here.

``host_eval_command`` turns a row's official eval script into a command whose log and exit status the
tested code cannot forge; ``HostGrader`` parses the log with the harness package's own log parser and
grades it with the same driver the sandbox program embeds.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Mapping
from typing import Any

from sweflow.errors import EvalError, HarnessError
from sweflow.harness import driver, standalone
from sweflow.harness.loader import TEST_EXIT_ECHO, Harness, load_harness
from sweflow.harness.standalone import WORKDIR, unpack_command
from sweflow.schema import default

EVAL_SCRIPT = f"{WORKDIR}/eval.sh"
# Where the host copy of the eval script is written in the fresh sandbox (read into memory, then deleted).
HOST_SCRIPT = "/tmp/.sweflow/host-eval.sh"
RC_VAR = "sweflow_test_rc"
KILL_GRACE_S = 30


def row_eval_script(metadata: Mapping[str, Any], cmd: str) -> str:
    """The official (instrumented) eval script packed inside a row's evaluator command."""
    try:
        files = unpack_command(cmd)
    except Exception as exc:  # noqa: BLE001 - any decoding problem is a malformed row
        raise EvalError(
            f"the evaluator command cannot be unpacked: {type(exc).__name__}: {exc}",
            row=metadata.get("instance_id"),
            field="blackbox_execute_cmds.after_agent",
        ) from None
    script = files.get(EVAL_SCRIPT)
    if not script:
        raise EvalError(
            "the evaluator command carries no eval script",
            row=metadata.get("instance_id"),
            field="blackbox_execute_cmds.after_agent",
        )
    return script


def host_eval_script(script: str, *, instance_id: str | None = None) -> str:
    """The eval script with the echoed test exit code replaced by ``exit <test status>`` at the end.

    The official script resets the test files after the test command; that still runs, then the shell
    exits with the test command's own status, so the exit status the provider records is the test's.
    """
    lines = script.split("\n")
    hits = [i for i, line in enumerate(lines) if line.strip() == TEST_EXIT_ECHO]
    if len(hits) != 1:
        raise EvalError(
            f"the eval script has {len(hits)} exit-code instrumentation lines (expected 1)",
            row=instance_id,
            field="blackbox_execute_cmds.after_agent",
            hint="re-run convert: the row predates instrumented eval scripts",
        )
    lines[hits[0]] = f"{RC_VAR}=$?"
    body = "\n".join(lines).rstrip("\n")
    return body + f'\nexit "${{{RC_VAR}:-1}}"\n'


# The shell that runs the host script holds all of it in memory (the test patch, the planted canaries), and the
# tested code runs as that shell's child: it could read its ancestor's memory (/proc/<pid>/mem) and tell the
# host's canaries from the row's tests. ``sealed`` ends the setup part with an ``exec`` of a fresh shell that is
# handed only the test section: from the start-of-test-output line on, no process above the tests holds the
# setup. Exported variables (the activated env) and the working folder carry over; shell options are set again.
def sealed(script: str, start_marker: str | None, *, instance_id: str | None = None) -> str:
    """`script` whose test section runs in a new shell that replaces the one that ran the setup."""
    if not start_marker:
        return script
    lines = script.split("\n")
    at = [i for i, ln in enumerate(lines) if start_marker in ln and "<<" not in ln]
    if not at:
        raise EvalError(
            "the eval script has no start-of-test-output line to run the tests from",
            row=instance_id,
            field="blackbox_execute_cmds.after_agent",
        )
    options = [ln for ln in lines[: at[0]] if re.match(r"\s*set\s+[-+]", ln)]
    tail = "\n".join(options + lines[at[0] :])
    # no trace of the exec line: it holds the test section's text, markers included, and the log parser takes
    # the first start-of-test-output line it sees
    run = f"exec bash --noprofile --norc -c {shlex.quote(tail)} sweflow-tests"
    return "\n".join([*lines[: at[0]], "{ set +x; } 2>/dev/null", run, ""])


# A training row carries the official eval script inside its after-agent evaluator command (packed with the
# in-sandbox parser, see ``standalone``). For a grade the tested code cannot forge, ``host_eval_command``
# turns that script into a command whose exit status IS the test command's status (the provider records it for
# the process it started) and which holds the whole script in memory before any tested code runs (bash reads a
# script FILE lazily, so code under test could rewrite the lines still to come).
def host_eval_command(timeout_sec: int, *, script_path: str = HOST_SCRIPT) -> str:
    """The command the provider runs: load the script into memory, delete it, run it under ``timeout``.

    stdout and stderr are merged into one stream (the provider pipes it to the host). stdin is closed so
    tested code cannot read what the shell has not read yet. Exit 124/137 means the eval timed out.
    """
    inner = f's=$(cat {script_path}) && rm -f {script_path} && eval "$s"'
    return (
        f"timeout -k {KILL_GRACE_S} {int(timeout_sec)} bash -c {shlex.quote(inner)} sweflow-eval"
        " </dev/null 2>&1"
    )


# The log comes back through the provider's own pipe (``Sandbox.run_logged``); ``HostGrader`` parses it with
# the harness package's own log parser, in this process, and grades it with the same driver the sandbox
# program embeds.
class HostGrader:
    """Parse and grade evaluation logs with one harness package's own log parsers (thread-safe)."""

    _cache: dict[str, HostGrader] = {}
    _lock = threading.Lock()

    def __init__(self, harness: Harness) -> None:
        self.harness = harness

    @classmethod
    def for_package(cls, package: str) -> HostGrader:
        """A grader over ``package`` (loaded once per process)."""
        with cls._lock:
            if package not in cls._cache:
                cls._cache[package] = cls(load_harness(package))
            return cls._cache[package]

    @classmethod
    def for_metadata(cls, metadata: Mapping[str, Any]) -> HostGrader:
        info = metadata.get("harness") or {}
        return cls.for_package(str(info.get("package") or default("harness.package")))

    def parser_for(self, metadata: Mapping[str, Any]):
        """The row's parser: by the function name the row records, else the package's repo table."""
        name = (metadata.get("harness") or {}).get("parser")
        if name:
            try:
                return self.harness.find_parser(str(name))
            except HarnessError:
                return None
        try:
            return self.harness.parser_for_instance(metadata)  # a 5.x row's log_parser, else by repo
        except HarnessError:
            return None

    def grade(self, log: str, metadata: Mapping[str, Any], exit_code: int | None) -> driver.GradeResult:
        """Grade ``log`` for the row; ``exit_code`` is the provider-recorded status of the eval command."""
        meta = {
            "FAIL_TO_PASS": list(metadata.get("FAIL_TO_PASS") or []),
            "PASS_TO_PASS": list(metadata.get("PASS_TO_PASS") or []),
            "instance_id": metadata.get("instance_id", ""),
            "repo": metadata.get("repo", ""),
            "version": str(metadata.get("version", "")),
        }
        eval_type = (metadata.get("harness") or {}).get("eval_type")
        meta.update(standalone.grading_mode(self.harness, {"eval_type": eval_type}))
        return driver.evaluate_log(
            self.parser_for(metadata),
            log,
            meta,
            exit_code,
            self.harness.start_marker,
            self.harness.end_marker,
            test_exit_code=exit_code,
            trusted_exit_code=True,
        )
