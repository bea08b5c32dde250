"""Grading, outside every sandbox: how a patch earns its reward and whether a task can be trained on.

It owns the fresh-sandbox evaluation of a patch (`evaluate`: extract it, apply it to a new sandbox, run the
row's eval script through the provider's pipe, grade the log on the host with the harness package's parser;
`agent_eval`: its retries for an agent's patch; `fresh`: the one trusted sandbox step; `canary*`: host tests),
the integrity rules (`patch_integrity` for what a patch may not touch, `integrity` for agent tool calls that
fetch the solution or edit tests), the reward from a grade (`reward`) and the validation verdicts of a task
(`task_validation`: gold must resolve, empty must not). Eval scripts and log parsers come from `sweflow.harness`.
"""
