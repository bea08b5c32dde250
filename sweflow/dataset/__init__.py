"""The dataset side: from a Hub revision to training rows.

It owns the Hub client (`hub_client`: revision -> commit sha, one file at that sha, offline copies), split
reading and validation in both row shapes (`splits`), task -> image naming (`image_names`), one validated
row -> one training JSONL row (`convert`) and the before-agent git sanitizer every row carries (`sanitizer`).
"""

# The local Hub standing in for huggingface.co is `sweflow.offline.local_hub`; `image_names` also owns the
# per-image records. Nothing here knows the workflow's file layout; `sweflow.stages.data` reads and writes the
# files.
