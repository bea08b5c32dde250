"""Held-out evaluation of checkpoints: resolve rates (pass@1 with an interval, pass@k) and SWE-bench's formats."""
