"""The dataset side: from a Hub revision to training rows.

It owns the Hub client (`hub_client`: revision -> commit sha, one file at that sha, offline copies; the local
Hub standing in for huggingface.co is `sweflow.offline.local_hub`), split reading and validation in both row
shapes (`splits`), task -> image naming and the per-image records (`image_names`), one validated row -> one
training JSONL row (`convert`) and the before-agent git sanitizer every row carries (`sanitizer`). Nothing
here knows the workflow's file layout; `sweflow.stages.data` reads and writes the files.
"""
