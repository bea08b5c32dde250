import json
import sys

from snakemake.settings.types import DeploymentMethod
from snakemake.utils import min_version

from sweflow.config import workflow_config
from sweflow.stages.common import model_dir_name
from sweflow.errors import ConfigError
from sweflow.util import redact

min_version("9.0")


# One line on stderr and exit 1 for any config problem (an exception here would print a traceback).
_USES_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
try:
    workflow_config(
        config,
        configfiles=workflow.config_settings.configfiles,
        overrides=workflow.config_settings.config,
        uses_conda=_USES_CONDA,
    )
except ConfigError as _exc:
    sys.exit(f"sweflow: {_exc.one_line()}")

DATASET = config["dataset"]["name"]
SPLITS = config["dataset"]["select_splits"] or list(config["dataset"]["splits"])
PROVIDER = config["sandbox"]["provider"]
# Snakemake records params in clear (.snakemake/metadata): an endpoint goes in without its credentials,
# and the scripts read the real one from config at run time.
HUB_ENDPOINT_PARAM = redact(config["dataset"]["hub"]["endpoint"] or "") or None


wildcard_constraints:
    dataset=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    split=r"[A-Za-z0-9_-]+",
    key=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    provider=r"local|docker|e2b",


def redacted(section):
    """A config section for params (recorded in clear): credentials in its strings redacted."""
    return json.loads(redact(json.dumps(section)))


def split_file(wildcards):
    return config["dataset"]["splits"][wildcards.split]["file"]


def offline_files(wildcards):
    """In offline mode the split files are real inputs, so editing them re-runs what depends on them."""
    folder = config["dataset"]["hub"]["offline_dir"]
    if not folder:
        return []
    splits = config["dataset"]["splits"]
    names = (
        [splits[wildcards.split]["file"]]
        if hasattr(wildcards, "split")
        else [splits[name]["file"] for name in SPLITS]
    )
    return [f"{folder}/{name}" for name in names]


def expected_rows(wildcards):
    return config["dataset"]["splits"][wildcards.split].get("rows")


def image_keys(wildcards):
    """Per-image keys, known once the list_images checkpoint has run."""
    from sweflow.stages.common import image_keys_from_listing

    listing = checkpoints.list_images.get(dataset=wildcards.dataset).output.listing
    return image_keys_from_listing(listing)


def _source_hash():
    """Hash of the sweflow sources that go into the in-sandbox runtime wheel (a few hundred small files)."""
    from sweflow.stages.common import runtime_source_hash

    return runtime_source_hash(workflow.basedir)


SWEFLOW_SOURCE_HASH = _source_hash()


def template_inputs(wildcards):
    """A template build needs its image record and, unless images are prebuilt, the shared artifacts."""
    inputs = {"image": f"results/{wildcards.dataset}/images/{wildcards.key}.json"}
    if not config["sandbox"]["prebuilt"]:
        version = config["sandbox"]["claude_code_version"]
        inputs["claude"] = f"resources/sandbox/claude-code/{version}/claude.json"
        inputs["wheel"] = "resources/sandbox/runtime/wheel.json"
    return inputs


def template_records(wildcards):
    return expand(
        "results/{dataset}/templates/{provider}/{key}.json",
        dataset=wildcards.dataset,
        provider=PROVIDER,
        key=image_keys(wildcards),
    )


def smoke_markers(wildcards):
    return expand(
        "results/{dataset}/smoke/{provider}/{key}.json",
        dataset=wildcards.dataset,
        provider=wildcards.provider,
        key=image_keys(wildcards),
    )


def validation_results(wildcards):
    """Per-task result files, one per row of the converted JSONL (known once validation_tasks has run)."""
    from sweflow.stages.common import listed_ids

    listing = checkpoints.validation_tasks.get(
        dataset=wildcards.dataset, split=wildcards.split
    ).output.listing
    return expand(
        "results/{dataset}/{split}/validation/{instance_id}.json",
        dataset=wildcards.dataset,
        split=wildcards.split,
        instance_id=listed_ids(listing),
    )


def reopen_error_summaries():
    """Validation summaries with `error` tasks re-run next time (see sweflow.stages.validate.reopen_summaries)."""
    from sweflow.stages.common import reopen_error_summaries as reopen

    reopen(
        expand(
            "results/{dataset}/{split}/validation-summary.json",
            dataset=DATASET,
            split=SPLITS,
        )
    )


def write_run_manifest():
    from sweflow.stages.common import write_run_manifest as write

    write(f"results/{DATASET}/manifest.json", root=".")


# ----- training (rules/train.smk)
TRAIN = config["train"]
TRAIN_MODEL = TRAIN["model"]
MODEL_NAME = TRAIN_MODEL["name"] or model_dir_name(TRAIN_MODEL["repo_id"])
# "dataset": the dataset's Hub (the bundled local one in the embedded default)
MODEL_ENDPOINT = (
    config["dataset"]["hub"]["endpoint"]
    if TRAIN_MODEL["endpoint"] == "dataset"
    else TRAIN_MODEL["endpoint"]
)
TRAIN_GPUS = TRAIN["parallel"]["gpus_per_node"]
TRAIN_NODES = TRAIN["parallel"]["nodes"]
USE_MEGATRON = TRAIN["engine"] == "verl" and TRAIN_MODEL["megatron"]["enabled"]
GRPO_DIR = f"results/{DATASET}/grpo/{TRAIN['run']}"
TRAIN_TARGETS = [f"{GRPO_DIR}/summary.json"] if TRAIN["enabled"] else []


def grpo_model(wildcards):
    """The weights GRPO starts from: the warm-started model when configured, else the Hub snapshot."""
    if TRAIN["warm_start"]["enabled"]:
        return f"results/{wildcards.dataset}/warm_start/{MODEL_NAME}/hf"
    return f"models/{MODEL_NAME}/hf"


def grpo_megatron(wildcards):
    return [f"models/{MODEL_NAME}/torch_dist"] if USE_MEGATRON else []
