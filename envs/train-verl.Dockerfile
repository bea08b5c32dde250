# The verl engine's GPU image: NVIDIA's PyTorch container (CUDA 13, cuDNN, NCCL, a matching
# transformer-engine build) + the pins of envs/train-verl.yaml + sweflow.
#   docker build -f envs/train-verl.Dockerfile -t sweflow-train-verl .
# Snakemake runs train_grpo in it with --software-deployment-method apptainer (or the conda env).
FROM nvcr.io/nvidia/pytorch:26.01-py3

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=true

COPY envs/harness.txt /tmp/harness.txt

# The base image's torch is replaced by the one verl 0.9.1 pins; everything else is pinned like the conda env.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cu130 \
        torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0 \
 && pip install --extra-index-url https://download.pytorch.org/whl/cu130 \
        "verl[verl-core]==0.9.1" \
        vllm==0.24.0 \
        transformers==5.9.0 \
        "ray[default]==2.60.0" \
        tensordict==0.10.0 \
        TransferQueue==0.1.11 \
        "mbridge @ git+https://github.com/ISEEKYAN/mbridge.git@641a5a01de71080b2200d10e369090e40c9a351c" \
        megatron-core==0.19.0 \
        "megatron-bridge @ git+https://github.com/NVIDIA-NeMo/Megatron-Bridge.git@0f113aba4bf625ab31c3a99f771ee24aa97d6dfd" \
        "transformer-engine[pytorch]==2.14.0" \
        flash-linear-attention==0.5.2 \
        nvidia-modelopt==0.44.0 \
        liger-kernel==0.8.2 \
        e2b==2.63.0 docker==7.2.0 httpx==0.28.1 \
        -r /tmp/harness.txt \
 && MAX_JOBS=8 pip install --no-build-isolation flash-attn==2.8.3

WORKDIR /opt/sweflow
COPY pyproject.toml README.md ./
COPY sweflow ./sweflow
RUN pip install --no-deps -e . \
 && python -c "import verl, vllm, megatron.bridge, transformer_engine, sweflow.train.verl_engine; print('verl', verl.__version__)"
