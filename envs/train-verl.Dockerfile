# The verl engine's GPU image: NVIDIA's PyTorch container (CUDA 13 toolkit, cuDNN, NCCL: what the source
# builds of stage 3 need) + the env of envs/train-verl.yaml, installed in the same stages from the same lock.
#   docker build -f envs/train-verl.Dockerfile -t sweflow-train-verl .
# Snakemake runs train_grpo in it with --software-deployment-method apptainer (or the conda env).
FROM nvcr.io/nvidia/pytorch:26.01-py3

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=true

WORKDIR /opt/sweflow
COPY envs/harness.txt /tmp/harness.txt
COPY envs/train-verl.lock.txt envs/train-verl.nodeps.txt envs/train-verl.post-deploy.sh ./envs/

# 1. the lock (it replaces the base image's torch with 2.11.0, the CUDA 13 build verl 0.9.1 pins) + harnesses
RUN pip install -r envs/train-verl.lock.txt -r /tmp/harness.txt

COPY pyproject.toml README.md ./
COPY sweflow ./sweflow
# 2 and 3: megatron-bridge --no-deps, the source builds, sweflow --no-deps, and the import check
RUN bash envs/train-verl.post-deploy.sh
