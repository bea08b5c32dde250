"""Training: the GRPO recipe (config -> engine config) and its engines.

`recipe` (the `train:` section as a Recipe, and what each engine can run), `attention` (blockwise
sliding-window attention for long CPU sessions), `algos` (the loss and advantage
formulas), `rollouts` (the live policy behind the proxy, the Dispatcher, per-sample records and step
statistics), `trl_engine` (TRL's GRPOTrainer, one machine), `verl_engine` + `verl_agent_loop` + `verl_metrics` (verl's v1
sync trainer, Megatron + vLLM on Ray), `warm_start` (a supervised start on recorded trajectories).
"""
