"""Upstream's own grading data (SWE-bench's parser and grading tests, SWE-smith's logs) as cases for sweflow."""
