"""Every disagreement with upstream's expected answers that the corpus test accepts, with its reason.

``DELIBERATE``: sweflow is stricter than upstream on purpose (for every harness version). ``HARNESS``: per
harness version, cases its own functions answer otherwise (upstream fixed them later); a parser case
whose sweflow answer is the harness parser's own answer is counted as the harness's without a listing.
"""

MF = "test_grading_marker_fallback.py::"

DELIBERATE = {
    MF + "test_results_outside_markers_fall_back_to_whole_log#0": (
        "results printed before the start marker do not count: upstream falls back to the whole log when the "
        "marked section parses to nothing, but the part before the start marker is the install output, which "
        "a patch prints into (pip install -e . runs its code); sweflow falls back to the log from the start "
        "marker on, so results printed after the end marker still count"
    ),
    MF + "test_empty_results_with_runner_evidence_is_a_clean_run#0": (
        "a pass-and-fail row whose log parses to nothing is no_tests_parsed in sweflow; upstream calls it "
        "found (an empty map: every FAIL_TO_PASS test absent, so unresolved): the same verdict for every "
        "row that has a FAIL_TO_PASS test, only the reason differs. Fail-only rows take the evidence, as "
        "upstream does"
    ),
}

HARNESS = {
    "4.1.0": {
        MF + "test_a_clean_jasmine_run_counts_as_having_run#0": (
            "swebench 4.1 has no fail-only eval type and no SUITE_RAN evidence pattern (5.x added both); "
            "sweflow reads the pattern from the harness package, and 4.1 ships no fail-only rows"
        ),
        MF + "test_a_real_karma_run_is_still_evidence#0": "as the jasmine case: no SUITE_RAN in swebench 4.1",
    },
    "2.0.13": {
        MF + "test_missing_markers_still_reports_not_found#0": (
            "the SWE-Gym fork has no test-output markers (it parses the log after 'APPLY_PATCH_PASS (pred)'), "
            "so there is no marker to require"
        ),
    },
}
