import json
import re
import sys

from snakemake.settings.types import DeploymentMethod
from snakemake.utils import min_version

from sweflow.config import workflow_config
from sweflow.stages.common import (
    SMITH_FIRST_STRATEGIES,
    end_of_run,
    model_dir_name,
    profile_entries,
    smith_harness,
)
from sweflow.errors import ConfigError
from sweflow.params import canonical, result_values, section
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
# Sorted: the splits mapping's key order is how a file was written, not a value (params compare by repr).
SPLITS = config["dataset"]["select_splits"] or sorted(config["dataset"]["splits"])
# Where the main dataset's split files come from: the Hub (download) or the SWE-smith branch (rules/smith.smk).
FROM_SMITH = config["dataset"]["source"] == "smith"
# The synthesized dataset: the main one (dataset.source smith) or a second one beside it (smith.enabled).
SMITH_DATASET = DATASET if FROM_SMITH else config["smith"]["dataset"]
SMITH_ON = FROM_SMITH or config["smith"]["enabled"]
SMITH_SPLIT = "train"
if FROM_SMITH:
    SPLITS = [SMITH_SPLIT]
# Per-dataset settings of the data and validate rules: every dataset the run processes (the main one, and
# the synthesized one when SWE-smith runs beside it). Synthesized rows are raw SWE-Gym rows of one split.
DATASETS = {
    DATASET: {
        "splits": [SMITH_SPLIT] if FROM_SMITH else SPLITS,
        "rows": (
            {}
            if FROM_SMITH
            else {k: v.get("rows") for k, v in config["dataset"]["splits"].items()}
        ),
        "shape": "raw" if FROM_SMITH else config["dataset"]["row_shape"],
        "limit": None if FROM_SMITH else config["dataset"]["limit"],
        "naming": config["images"],
        "harness": config["harness"],
    }
}
if SMITH_ON and not FROM_SMITH:
    DATASETS[SMITH_DATASET] = {
        "splits": [SMITH_SPLIT],
        "rows": {},
        "shape": "raw",
        "limit": None,
        "naming": {**config["images"], "prefix": "sweflow-smith/sweb.eval.x86_64."},
        "harness": config["harness"],
    }
HUB_DATASETS = [] if FROM_SMITH else [DATASET]
# a pattern that matches no name when every dataset is synthesized
HUB_WILDCARD = "|".join(re.escape(d) for d in HUB_DATASETS) or "(?!)"
PROVIDER = config["sandbox"]["provider"]
# Snakemake records params in clear (.snakemake/metadata): an endpoint goes in without its credentials,
# and the scripts read the real one from config at run time.
HUB_ENDPOINT_PARAM = redact(config["dataset"]["hub"]["endpoint"] or "") or None


wildcard_constraints:
    dataset="|".join(re.escape(d) for d in DATASETS),
    split=r"[A-Za-z0-9_-]+",
    key=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    provider=r"local|docker|e2b",


def redacted(section):
    """A config section for params (recorded in clear): credentials in its strings redacted."""
    return json.loads(redact(json.dumps(section)))


def result_params(path, without=()):
    """Params for the config section at dotted `path`: only the values that can change a result
    (config/keys.yaml), sorted and in one number form, credentials redacted. Scripts read the whole
    section (operational values too) from the config at run time (sweflow.rulekit.live). `without`:
    result keys of the section that the rule never reads (a rule that reads one passes it on its own).
    """
    values = result_values(section(config, path), path)
    return redacted({k: v for k, v in values.items() if k not in without})


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
    return DATASETS[wildcards.dataset]["rows"].get(wildcards.split)


def dataset_setting(key):
    """An input/params function: the per-dataset setting `key` of the wildcards' dataset (DATASETS),
    canonical (sorted keys) so a reordered config is the same param."""
    return lambda wildcards: canonical(DATASETS[wildcards.dataset][key])


def dataset_files(pattern):
    """An input function: `pattern` (with {dataset} and {split}) for every split of the wildcards' dataset."""
    return lambda wildcards: expand(
        pattern, dataset=wildcards.dataset, split=DATASETS[wildcards.dataset]["splits"]
    )


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


def task_repos(wildcards):
    """repo -> the bare repository of its synthesized task states, for the synthesized dataset's images."""
    return SMITH_TASK_REPOS if wildcards.dataset == SMITH_DATASET and SMITH_ON else {}


def template_inputs(wildcards):
    """A template build needs its image record and, unless images are prebuilt, the shared artifacts (and
    for a synthesized task, the repositories that hold task states)."""
    inputs = {"image": f"results/{wildcards.dataset}/images/{wildcards.key}.json"}
    for n, path in enumerate(sorted(task_repos(wildcards).values())):
        inputs[f"tasks_git_{n}"] = path
    if not config["sandbox"]["prebuilt"]:
        version = config["sandbox"]["claude_code_version"]
        inputs["claude"] = f"resources/sandbox/claude-code/{version}/claude.json"
        inputs["wheel"] = "resources/sandbox/runtime/wheel.json"
    return inputs


def template_records(wildcards):
    """Per-image build records; prebuilt images (template = image) need no job per image: the listing."""
    if config["sandbox"]["prebuilt"]:
        return [f"results/{wildcards.dataset}/images.txt"]
    return expand(
        "results/{dataset}/templates/{provider}/{key}.json",
        dataset=wildcards.dataset,
        provider=PROVIDER,
        key=image_keys(wildcards),
    )


def smoke_record(wildcards):
    """What a smoke test starts: the built template's record, or a prebuilt image's own record."""
    if config["sandbox"]["prebuilt"]:
        return f"results/{wildcards.dataset}/images/{wildcards.key}.json"
    return f"results/{wildcards.dataset}/templates/{wildcards.provider}/{wildcards.key}.json"


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
        [
            f"results/{name}/{split}/validation-summary.json"
            for name, ds in DATASETS.items()
            for split in ds["splits"]
        ]
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
# evaluate.engine vllm: each evaluation job starts a vLLM server on GPUs of its own (rules/evaluate.smk)
EVAL_VLLM = config["evaluate"]["engine"] == "vllm"
TRAIN_NODES = TRAIN["parallel"]["nodes"]
USE_MEGATRON = TRAIN["engine"] == "verl" and TRAIN_MODEL["megatron"]["enabled"]
GRPO_DIR = f"results/{DATASET}/grpo/{TRAIN['run']}"
TRAIN_TARGETS = [f"{GRPO_DIR}/summary.json"] if TRAIN["enabled"] else []


def grpo_model(wildcards):
    """The weights GRPO starts from: the warm-started model when configured, else the Hub snapshot."""
    if TRAIN["warm_start"]["enabled"] and TRAIN["warm_start"]["source"] == "sft":
        return f"results/{wildcards.dataset}/sft/train/{config['sft']['train']['run']}/final"
    if TRAIN["warm_start"]["enabled"]:
        return f"results/{wildcards.dataset}/warm_start/{MODEL_NAME}/hf"
    return f"models/{MODEL_NAME}/hf"


def grpo_megatron(wildcards):
    return [f"models/{MODEL_NAME}/torch_dist"] if USE_MEGATRON else []


# ----- evaluation (rules/evaluate.smk)
EVALUATE = config["evaluate"]
# a checkpoint is evaluated where the configuration makes it
_MADE = {
    "base": True,
    "warm_start": TRAIN["enabled"] and TRAIN["warm_start"]["enabled"],
    "grpo": TRAIN["enabled"],
    "sft": config["sft"]["enabled"] and config["sft"]["train"]["enabled"],
}
EVAL_TARGETS = (
    [
        f"results/{DATASET}/eval/{EVALUATE['split']}/{c}/summary.json"
        for c in EVALUATE["checkpoints"]
        if _MADE[c]
    ]
    + [
        f"results/{DATASET}/eval/{EVALUATE['split']}/predictions-{n}/report.json"
        for n in EVALUATE["predictions"]
    ]
    if EVALUATE["enabled"]
    else []
)


def checkpoint_model(wildcards):
    """The weights an evaluated checkpoint's name stands for."""
    return {
        "base": f"models/{MODEL_NAME}/hf",
        "warm_start": f"results/{wildcards.dataset}/warm_start/{MODEL_NAME}/hf",
        "grpo": f"results/{wildcards.dataset}/grpo/{TRAIN['run']}/final",
        "sft": f"results/{wildcards.dataset}/sft/train/{config['sft']['train']['run']}/final",
    }[wildcards.checkpoint]


def outside_predictions(wildcards):
    return EVALUATE["predictions"][wildcards.name]


def publish_recipe(wildcards):
    """The result keys of the section that trained a published checkpoint."""
    return result_params("sft.train" if wildcards.checkpoint == "sft" else "train")


def evaluated(wildcards):
    """The evaluation summaries of every checkpoint evaluated (the card's table)."""
    return [t for t in EVAL_TARGETS if t.endswith("summary.json")]


def eval_recipe_params():
    """The training settings an evaluation's attempts use: sampling, token limits, the tampering price."""
    train = result_params("train")
    keep = ("sampling", "max_response_tokens", "max_context_tokens", "reward", "proxy")
    return {k: train[k] for k in keep if k in train}


# ----- SWE-smith (rules/smith.smk)
SMITH = config["smith"]
SMITH_PROFILES = profile_entries(SMITH["repos"]) if SMITH_ON else {}
SMITH_TASK_REPOS = {
    p.repo: f"results/smith/{name}/tasks.git" for name, p in SMITH_PROFILES.items()
}
SMITH_FIRST = [s for s in SMITH_FIRST_STRATEGIES if SMITH["strategies"][s]["enabled"]]
SMITH_ALL = SMITH_FIRST + (
    ["combine"] if SMITH["strategies"]["combine"]["enabled"] else []
)
if SMITH_ON:
    DATASETS[SMITH_DATASET]["harness"] = smith_harness(
        config["harness"], SMITH_PROFILES.values()
    )
SMITH_TARGETS = (
    [f"results/smith/{name}/summary.json" for name in SMITH_PROFILES]
    + [
        f"results/{SMITH_DATASET}/{SMITH_SPLIT}/{name}"
        for name in ("validation-summary.json", "tasks.valid.jsonl")
    ]
    if SMITH_ON
    else []
)


def smith_files(pattern, strategies):
    """An input function: `pattern` ({profile}, {strategy}, {shard}) for every shard of `strategies`."""
    return lambda wildcards: [
        pattern.format(profile=wildcards.profile, strategy=s, shard=i)
        for s in strategies
        for i in range(SMITH["strategies"][s]["shards"])
    ]


def candidate_inputs(wildcards):
    """Every strategy needs the repository; combine also needs the validated first-strategy candidates."""
    inputs = {
        "env": f"results/smith/{wildcards.profile}/env.json",
        "bare": f"results/smith/{wildcards.profile}/repo.git",
    }
    if wildcards.strategy == "combine":
        inputs["validated"] = smith_files(
            "results/smith/{profile}/validation/{strategy}/{shard}.jsonl", SMITH_FIRST
        )(wildcards)
        inputs["validated_candidates"] = smith_files(
            "results/smith/{profile}/candidates/{strategy}/{shard}.jsonl", SMITH_FIRST
        )(wildcards)
    return inputs


# ----- SFT (rules/sft.smk)
SFT = config["sft"]
SFT_DATASET = SFT["dataset"] or DATASET
SFT_SPLITS = SFT["splits"] or [TRAIN["split"]]
SFT_SHARDS = list(range(SFT["collect"]["shards"]))
SFT_RUN = SFT["train"]["run"]
SFT_NODES = SFT["train"]["parallel"]["nodes"]
SFT_GPUS = SFT["train"]["parallel"]["gpus_per_node"]
SFT_TARGETS = (
    [f"results/{SFT_DATASET}/sft/messages/summary.json"]
    + (
        [f"results/{SFT_DATASET}/sft/train/{SFT_RUN}/summary.json"]
        if SFT["train"]["enabled"]
        else []
    )
    if SFT["enabled"]
    else []
)


def sft_files(pattern):
    """An input function: `pattern` ({dataset}, {split}, {shard}) for every SFT split and shard."""
    return lambda wildcards: [
        pattern.format(dataset=wildcards.dataset, split=s, shard=i)
        for s in SFT_SPLITS
        for i in SFT_SHARDS
    ]


def _valid_rows_of(dataset, split):
    """(row folder, valid ids in file order) of a split once the valid_rows checkpoint has run. The
    validation_tasks checkpoint is asked first: until it is done Snakemake cannot know that the summary
    reruns, and would take valid_rows' present output (a verdict change reaching its readers one run late).
    """
    from sweflow.stages.common import listed_ids

    checkpoints.validation_tasks.get(dataset=dataset, split=split)
    out = checkpoints.valid_rows.get(dataset=dataset, split=split).output
    return out.rows, listed_ids(out.listing)


def sft_rows(wildcards):
    """The row files of one SFT shard's valid tasks (a stable hash of the instance id picks the shard, after
    sft.collect.limit): a changed verdict elsewhere leaves this shard's inputs as they were.
    """
    from sweflow.stages.common import shard_ids

    folder, ids = _valid_rows_of(wildcards.dataset, wildcards.split)
    picked = shard_ids(
        ids, int(wildcards.shard), SFT["collect"]["shards"], SFT["collect"]["limit"]
    )
    return [f"{folder}/{i}.jsonl" for i in picked]


def expert_parquet(wildcards):
    """The scripted expert replays gold patches, which only the split parquet holds."""
    if SFT["collect"]["expert"]["endpoint"] != "scripted":
        return []
    return [f"resources/datasets/{wildcards.dataset}/{wildcards.split}.parquet"]


def e2e_trajectories(wildcards):
    """The e2e check's recorded sessions, asked for once the valid_rows checkpoints are done: a job reading
    them (the warm start) is planned again with the e2e check, so when a verdict elsewhere leaves the check
    up to date it stays up to date too (planned before, it would run once for nothing).
    """
    for s in SPLITS:
        _valid_rows_of(wildcards.dataset, s)
    return f"results/{wildcards.dataset}/e2e/{E2E_INSTANCE}.trajectories.jsonl.gz"


def e2e_rows(wildcards):
    """The instance's own valid row file (whichever split holds it), so another task's verdict reruns nothing
    here; when no split holds it, every tasks.valid.jsonl (the step then says the task is not valid).
    """
    found = []
    for s in SPLITS:
        folder, ids = _valid_rows_of(wildcards.dataset, s)
        if wildcards.instance_id in ids:
            found.append(f"{folder}/{wildcards.instance_id}.jsonl")
    return found or [
        f"results/{wildcards.dataset}/{s}/tasks.valid.jsonl" for s in SPLITS
    ]
