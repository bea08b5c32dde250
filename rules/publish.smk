# Publish stage (asked for by target: results/<dataset>/publish/<checkpoint>.json, never part of `all`): a
# trained checkpoint pushed to publish.repo_id with a model card naming the training recipe, the dataset's
# commit sha, the held-out evaluation table and the provenance manifest's hash (sweflow.stages.publish).


rule publish:
    input:
        model=checkpoint_model,
        evaluations=evaluated,
        revision="resources/datasets/{dataset}/revision.json",
    output:
        record="results/{dataset}/publish/{checkpoint}.json",
        manifest="results/{dataset}/publish/{checkpoint}.manifest.json",
    log:
        "logs/{dataset}/publish/{checkpoint}.log",
    wildcard_constraints:
        checkpoint=r"warm_start|grpo|sft",
    localrule: True
    conda:
        "../envs/data.yaml"
    params:
        publish=result_params("publish"),
        recipe=publish_recipe,
        base_model=TRAIN_MODEL["repo_id"],
    script:
        "../scripts/publish.py"
