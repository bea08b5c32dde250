# Sandbox stage: one template per task image (built once, rebuilt only when its spec changes), smoke markers.


rule build_template:
    input:
        image="results/{dataset}/images/{key}.json",
    output:
        record="results/{dataset}/templates/{provider}/{key}.json",
    log:
        "logs/{dataset}/build_template/{provider}/{key}.log",
    conda:
        "../envs/sandbox.yaml"
    params:
        sandbox=config["sandbox"],
    script:
        "../scripts/build_template.py"


rule smoke:
    input:
        record="results/{dataset}/templates/{provider}/{key}.json",
    output:
        marker="results/{dataset}/smoke/{provider}/{key}.json",
    log:
        "logs/{dataset}/smoke/{provider}/{key}.log",
    conda:
        "../envs/sandbox.yaml"
    params:
        sandbox=config["sandbox"],
    script:
        "../scripts/smoke.py"


rule smoke_summary:
    input:
        markers=smoke_markers,
    output:
        summary="results/{dataset}/smoke-{provider}.json",
    log:
        "logs/{dataset}/smoke_summary-{provider}.log",
    conda:
        "../envs/sandbox.yaml"
    script:
        "../scripts/smoke_summary.py"
