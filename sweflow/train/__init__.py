"""Training: the GRPO recipe (config -> engine config) and its engines.

`recipe` (the `train:` section as a Recipe), `attention` (blockwise sliding-window attention), `algos` (the
loss and advantage formulas), `rollouts` (the live policy behind the proxy, the Dispatcher), `trl_engine`
(TRL), `verl_engine` + `verl_agent_loop` + `verl_metrics` (verl), `warm_start` (a supervised start).
"""

# More on each: `recipe` also says what each engine can run; `attention` is for long CPU sessions; `rollouts`
# also makes the per-sample records and step statistics; `trl_engine` is TRL's GRPOTrainer, one machine; the
# verl modules run verl's v1 sync trainer, Megatron + vLLM on Ray; `warm_start` is a supervised start on
# recorded trajectories.
