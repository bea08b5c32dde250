"""Snakemake entry point: the end-to-end check of one sample task (real agent, two scripted policies)."""

import sys
import tempfile
from pathlib import Path

from sweflow.e2e import e2e_stage
from sweflow.rulekit import from_snakemake
from sweflow.stages_sandbox import provider_from_config

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/e2e_check.py"), tempfile.TemporaryDirectory() as tmp:
    from transformers import AutoTokenizer

    tokenizer_dir = smk.params.tokenizer
    if not tokenizer_dir:
        # The tiny tokenizer of the test fixtures (built locally, no download) speaks the tool-call format.
        sys.path.insert(0, str(Path(smk.scriptdir).parent))
        from tests.fixtures.tiny_model import build_tiny_tokenizer

        tokenizer_dir = build_tiny_tokenizer(Path(tmp) / "tokenizer")
    e2e_stage(
        list(smk.input.jsonl),
        smk.output.report,
        instance_id=smk.wildcards.instance_id,
        provider=provider_from_config(smk.params.provider, smk.params.sandbox),
        tokenizer=AutoTokenizer.from_pretrained(str(tokenizer_dir)),
    )
