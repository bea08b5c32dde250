# Sandbox stage: Claude Code + runtime wheel built once, one template per task image (rebuilt only when its
# spec changes), one smoke marker per template, and a per-item summary.


rule claude_code:
    output:
        record="resources/sandbox/claude-code/{version}/claude.json",
    log:
        "logs/sandbox/claude_code-{version}.log",
    localrule: True
    conda:
        "../envs/sandbox.yaml"
    script:
        "../scripts/claude_code.py"


rule runtime_wheel:
    output:
        record="resources/sandbox/runtime/wheel.json",
    log:
        "logs/sandbox/runtime_wheel.log",
    localrule: True
    conda:
        "../envs/sandbox.yaml"
    params:
        source=SWEFLOW_SOURCE_HASH,
    script:
        "../scripts/runtime_wheel.py"


rule build_template:
    input:
        unpack(template_inputs),
    output:
        record="results/{dataset}/templates/{provider}/{key}.json",
    log:
        "logs/{dataset}/build_template/{provider}/{key}.log",
    conda:
        "../envs/sandbox.yaml"
    params:
        sandbox=result_params("sandbox"),
        task_repos=task_repos,
    script:
        "../scripts/build_template.py"


rule smoke:
    input:
        record=smoke_record,
    output:
        marker="results/{dataset}/smoke/{provider}/{key}.json",
    log:
        "logs/{dataset}/smoke/{provider}/{key}.log",
    conda:
        "../envs/sandbox.yaml"
    params:
        sandbox=result_params("sandbox"),
    script:
        "../scripts/smoke.py"


rule smoke_summary:
    input:
        markers=smoke_markers,
    output:
        summary="results/{dataset}/smoke-{provider}.json",
    log:
        "logs/{dataset}/smoke_summary-{provider}.log",
    # about a second or less of work on small files: not worth a cluster job
    localrule: True
    conda:
        "../envs/sandbox.yaml"
    script:
        "../scripts/smoke_summary.py"
