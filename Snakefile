# sweflow: SWE task datasets -> sandbox templates -> training JSONL -> (validation, rollouts, training).
# Logic lives in the `sweflow` library; rules only wire files together. See README.md.


# The embedded default (found next to this Snakefile whatever --directory is) applies only when the user
# gives no --configfile: a user's config is theirs, complete with the schema defaults (rules/common.smk).
if not workflow.config_settings.configfiles:

    configfile: f"{workflow.basedir}/config/config.yaml"


include: "rules/common.smk"
include: "rules/smith.smk"
include: "rules/data.smk"
include: "rules/sandbox.smk"
include: "rules/validate.smk"
include: "rules/e2e.smk"
include: "rules/train.smk"
include: "rules/sft.smk"
include: "rules/evaluate.smk"
include: "rules/publish.smk"


# The pipeline's end products: `all` asks for them, and the report (written last) shows them.
TARGETS = dict(
    jsonl=expand("results/{dataset}/{split}.jsonl", dataset=DATASET, split=SPLITS),
    template_map=f"results/{DATASET}/template-map.json",
    smoke=f"results/{DATASET}/smoke-{PROVIDER}.json",
    validation=expand(
        "results/{dataset}/{split}/validation-summary.json",
        dataset=DATASET,
        split=SPLITS,
    ),
    valid_tasks=expand(
        "results/{dataset}/{split}/tasks.valid.jsonl",
        dataset=DATASET,
        split=SPLITS,
    ),
    e2e=E2E_TARGETS,
    train=TRAIN_TARGETS,
    smith=SMITH_TARGETS,
    sft=SFT_TARGETS,
    evaluate=EVAL_TARGETS,
)
REPORT_INPUTS = TARGETS


include: "rules/report.smk"


rule all:
    default_target: True
    input:
        **TARGETS,
        report=f"results/{DATASET}/report.html",


rule data:
    input:
        jsonl=expand("results/{dataset}/{split}.jsonl", dataset=DATASET, split=SPLITS),
        template_map=f"results/{DATASET}/template-map.json",


onstart:
    # reap the sandboxes and build folders of an earlier, killed run (sweflow.sandbox.ledger); instant when
    # there are none, and a running pipeline's own are left alone
    from sweflow.stages.common import reap_leftovers

    reap_leftovers()


onsuccess:
    end_of_run()
    reopen_error_summaries()
    write_run_manifest()


onerror:
    end_of_run()
    reopen_error_summaries()
