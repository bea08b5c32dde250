"""Provenance: a record per artifact, the run manifest, lineage audit and verification.

Rules call `write_records` (or `record_snakemake`) after writing their outputs; the Snakefile's `onsuccess`
calls `write_manifest`. `sweflow audit` and `sweflow verify` read what they wrote.
"""

from sweflow.provenance.audit import find_root, format_lineage, lineage, params_summary, problems
from sweflow.provenance.records import (
    PROVENANCE_DIR,
    ROOT_ENV,
    FileState,
    file_state,
    git_state,
    load_record,
    provenance_root,
    record_path,
    record_snakemake,
    redact_value,
    software_versions,
    sweflow_tree_sha256,
    write_records,
)
from sweflow.provenance.verify import (
    Problem,
    VerifyReport,
    find_manifests,
    iter_records,
    manifest_entries,
    read_manifest,
    verify,
    write_manifest,
)

__all__ = [
    "PROVENANCE_DIR",
    "ROOT_ENV",
    "FileState",
    "Problem",
    "VerifyReport",
    "file_state",
    "find_manifests",
    "find_root",
    "format_lineage",
    "git_state",
    "iter_records",
    "lineage",
    "load_record",
    "manifest_entries",
    "params_summary",
    "problems",
    "provenance_root",
    "read_manifest",
    "record_path",
    "record_snakemake",
    "redact_value",
    "software_versions",
    "sweflow_tree_sha256",
    "verify",
    "write_manifest",
    "write_records",
]
