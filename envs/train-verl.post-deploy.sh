#!/usr/bin/env bash
# Stages 2 and 3 of the verl env (envs/train-verl.yaml says why each): run by Snakemake inside the new conda
# env after stage 1, from the workflow's folder, and by envs/train-verl.Dockerfile. Needs nvcc (CUDA 13).
# The lock's sha256 below makes Snakemake build a new env when the lock changes (it hashes this file, not the
# files the env's pip section reads); tests/unit/test_env_lock.py keeps it equal to the lock's.
set -euo pipefail
LOCK_SHA256=241d614611c48e170c8502cdced47af3e0e981fba6d56ee918af9cacf421c35b
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
envs=${SWEFLOW_ENVS:-envs}
[[ -f "$envs/train-verl.lock.txt" ]] || envs=$here
echo "$LOCK_SHA256  $envs/train-verl.lock.txt" | sha256sum --check --quiet \
  || { echo "sweflow: $envs/train-verl.lock.txt is not the lock this script was written for" >&2; exit 2; }

# 2. megatron-bridge without its own pins (flashinfer 0.6.8.post1 against vllm's 0.6.12)
python -m pip install --no-deps -r "$envs/train-verl.nodeps.txt"

# 3. no wheel on the index: built here, against the lock's torch
if ! command -v nvcc >/dev/null; then
  echo "sweflow: nvcc not found: transformer-engine-torch, flash-attn and fast-hadamard-transform build from source;" \
       "load a CUDA 13 toolkit (or use envs/train-verl.Dockerfile)" >&2
  exit 3
fi
MAX_JOBS=${MAX_JOBS:-8} python -m pip install --no-deps --no-build-isolation \
  transformer-engine-torch==2.14.1 flash-attn==2.8.3 fast-hadamard-transform==1.1.0
python -m pip install --no-deps -e "$envs/.."
python -c "import verl, vllm, megatron.core, megatron.bridge, transformer_engine.pytorch, sweflow.train.verl_engine"
