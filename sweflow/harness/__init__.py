"""The evaluation harness layer: official eval scripts, a standalone log grader and the evaluator command.

``load_harness`` loads the package, ``Harness.evaluator_command`` builds the in-sandbox command, ``grade``
is the same grading code on the host; a typical use is shown above ``__all__``.
"""

from sweflow.harness.driver import DEFAULT_REWARD_MARKER, FAILURE_REASONS, GradeResult, grade
from sweflow.harness.loader import Harness, instrument_exit_code, load_harness
from sweflow.harness.standalone import (
    evaluator_files,
    expected_tests,
    standalone_parser_source,
    unpack_command,
)

# Typical use::
#
#     h = load_harness("swebench")            # or "swegym"
#     h.register_repos({"sweflow/calclib": {"0.1": {"python": "3.11", "test_cmd": "pytest -rA"}}},
#                      {"sweflow/calclib": "parse_log_pytest"})
#     cmd = h.evaluator_command(instance)      # run in the task sandbox; stdout has the marker line
#     result = grade(statuses, f2p, p2p, test_exit_code)   # the same grading code, on the host
__all__ = [
    "DEFAULT_REWARD_MARKER",
    "FAILURE_REASONS",
    "GradeResult",
    "Harness",
    "evaluator_files",
    "expected_tests",
    "grade",
    "instrument_exit_code",
    "load_harness",
    "standalone_parser_source",
    "unpack_command",
]
