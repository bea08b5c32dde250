# End-to-end check: one sample task with the real agent in a real sandbox, the token-recording proxy in
# front of a scripted policy, the fresh-sandbox evaluation and the reward (a gold policy must score 1.0,
# a policy that edits a test file 0.0 with the integrity reason).

# The scripted policies know the fixes of the embedded sample only; set e2e.instance to null to skip.
E2E_INSTANCE = config["e2e"]["instance"]
E2E_TARGETS = [f"results/{DATASET}/e2e/{E2E_INSTANCE}.json"] if E2E_INSTANCE else []


rule e2e_check:
    input:
        jsonl=e2e_rows,
    output:
        report="results/{dataset}/e2e/{instance_id}.json",
        evidence="results/{dataset}/e2e/{instance_id}.evidence.jsonl.gz",
        trajectories="results/{dataset}/e2e/{instance_id}.trajectories.jsonl.gz",
    log:
        "logs/{dataset}/e2e_check/{instance_id}.log",
    wildcard_constraints:
        instance_id=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    conda:
        "../envs/agent.yaml"
    params:
        provider=PROVIDER,
        sandbox=result_params("sandbox"),
        tokenizer=config["e2e"]["tokenizer"],
    script:
        "../scripts/e2e_check.py"


rule e2e:
    input:
        reports=E2E_TARGETS,
