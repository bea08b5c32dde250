"""Model preparation for training: resolve a model repo's revision to a commit sha, download its snapshot
(config, tokenizer, weights) into a folder with a manifest of sizes and hashes, check such a folder, and
convert the Hugging Face weights to a Megatron `torch_dist` checkpoint for the verl engine.

`hub` holds the Hub side; `megatron` builds and runs the converter command in the GPU environment.
"""

# `hub` holds the Hub side (the real `huggingface_hub` client, the local Hub of `sweflow.offline.local_hub` in
# tests). No Snakemake and no knowledge of the results/ layout here: the train stage passes the paths.
