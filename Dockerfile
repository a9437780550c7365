# syntax=docker/dockerfile:1
#
# transformer-mt serving image: two stages.
#   build    python + CPU torch: exports the shipped checkpoint to ONNX bundles (fp32 for the CPU, fp32 and fp16 for CUDA)
#   runtime  CUDA 13 + cuDNN 9 runtime + onnxruntime-gpu + the service; no torch, no model/
#
#   docker build -t transformer-mt .
#   docker run --gpus all -p 8000:8000 transformer-mt     # GPU, fp16 bundle
#   docker run -p 8000:8000 transformer-mt                # same image on the CPU, fp32 bundle
#
# deploy/docker/entrypoint.sh picks the bundle (MT_PRECISION=auto|fp32|fp16, or MT_BUNDLE).
# tests/deploy/test_runtime_stage.py rehearses the runtime stage outside Docker: it installs
# deploy/requirements-serve.txt and copies the sources named by this file's runtime-stage COPY
# lines, so keep those lines one source path each.

# onnxruntime-gpu 1.31 (deploy/requirements-serve.txt) links CUDA 13 and cuDNN 9; the host
# driver must support CUDA 13 (R580 or newer).
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    OMP_NUM_THREADS=1
WORKDIR /src

# CPU torch first and pinned (the CUDA build is several GB and the export needs no GPU).
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml pyproject.toml
COPY README.md README.md
COPY model/ model/
COPY export/ export/
COPY service/ service/
# The export also imports service.bundle (pydantic) and onnxruntime (fp16 conversion, parity).
# The train extra's ranges live in pyproject.toml; torch, the one that matters, is pinned above.
# hadolint ignore=DL3013
RUN pip install ".[train]" onnxruntime==1.31.1 pydantic==2.14.3

# Both shipped directions, each for the CPU (fp32) and the GPU (fp16, or fp32 with a gather cache).
COPY checkpoints/multi30k-en-de/ checkpoints/multi30k-en-de/
COPY checkpoints/multi30k-de-en/ checkpoints/multi30k-de-en/
RUN python -m export --checkpoint checkpoints/multi30k-en-de \
        --out /bundles/multi30k-en-de-fp32 --dtype fp32 \
    && python -m export --checkpoint checkpoints/multi30k-en-de \
        --out /bundles/multi30k-en-de-fp32-cuda --dtype fp32 --cache gather \
    && python -m export --checkpoint checkpoints/multi30k-en-de \
        --out /bundles/multi30k-en-de-fp16 --dtype fp16 \
    && python -m export --checkpoint checkpoints/multi30k-de-en \
        --out /bundles/multi30k-de-en-fp32 --dtype fp32 \
    && python -m export --checkpoint checkpoints/multi30k-de-en \
        --out /bundles/multi30k-de-en-fp32-cuda --dtype fp32 --cache gather \
    && python -m export --checkpoint checkpoints/multi30k-de-en \
        --out /bundles/multi30k-de-en-fp16 --dtype fp16

# ---------------------------------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS runtime

# Ubuntu 24.04's python3 (3.12) in a venv: the NVIDIA image brings libcudart, cuBLAS, cuFFT,
# cuRAND and cuDNN 9; `docker run --gpus` / the device plugin bring the driver (libcuda.so.1).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin mt

ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MT_HOST=0.0.0.0 \
    MT_PORT=8000 \
    MT_BUNDLES_DIR=/app/bundles \
    MT_PRECISION=auto

WORKDIR /app

# Serving dependencies only (pinned): never torch.
COPY deploy/requirements-serve.txt deploy/requirements-serve.txt
RUN pip install -r deploy/requirements-serve.txt

# The service package, without its dependencies (they are the list above).
COPY pyproject.toml pyproject.toml
COPY README.md README.md
COPY service/ service/
COPY deploy/docker/entrypoint.sh deploy/docker/entrypoint.sh
COPY deploy/docker/healthcheck.py deploy/docker/healthcheck.py
RUN pip install --no-deps . && rm -rf build ./*.egg-info

COPY --from=build /bundles/ /app/bundles/

USER 10001:10001
EXPOSE 8000

# Loading and warming up the model takes a few seconds; /ready (not this) gates traffic.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py"]

# The entrypoint execs the service (PID 1 gets SIGTERM and drains: MT_DRAIN_TIMEOUT_S).
ENTRYPOINT ["/app/deploy/docker/entrypoint.sh"]
