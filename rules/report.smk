# Report stage: one self-contained HTML page with plots of every stage's figures, written last.


rule report:
    input:
        **REPORT_INPUTS,
    output:
        html="results/{dataset}/report.html",
    log:
        "logs/{dataset}/report.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        splits=SPLITS,
    script:
        "../scripts/report.py"
