"""Grading, outside every sandbox: how a patch earns its reward and whether a task can be trained on.

`evaluate` grades a patch in a fresh sandbox (`fresh`: the one trusted step, `canary*`: the host's tests,
`agent_eval`: retries for an agent's patch); `patch_integrity`/`integrity`: what a patch or a tool call may
not do; `reward`; `task_validation`: gold must resolve, empty must not. Eval scripts: `sweflow.harness`.
"""
