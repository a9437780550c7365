# syntax=docker/dockerfile:1
#
# transformer-mt images: one Dockerfile, two targets on the same plain Python base.
#   export  the shipped checkpoints exported to ONNX bundles (CPU torch and wheels only: no
#           compiler); nothing of it reaches the images below but the bundles
#   cpu     onnxruntime (CPU) + the service + the two fp32 bundles            (about 330 MB)
#   gpu     onnxruntime-gpu with CUDA 13 and cuDNN 9 from pinned wheels + the service + every
#           bundle (fp32 for the CPU, fp32 and fp16 for CUDA); also runs on the CPU (the default
#           target)                                                           (about 3.1 GB)
#
#   docker build -t transformer-mt .                          # gpu (the default target)
#   docker build --target cpu -t transformer-mt:cpu .         # CPU only, small
#   docker run --gpus all -p 8000:8000 transformer-mt         # GPU, fp16 bundle
#   docker run -p 8000:8000 transformer-mt                    # same image on the CPU, fp32 bundle
#
# The GPU image needs no CUDA base image: onnxruntime's CUDA provider finds the CUDA and cuDNN
# libraries of the nvidia-* wheels through onnxruntime.preload_dlls() (service/inference/engine.py).
# The host needs only an NVIDIA driver for CUDA 13 (R580 or newer) and the NVIDIA Container
# Toolkit. docs/operations.md ("The image") has the build, run, size and CI details.
#
# Build arguments: BASE_IMAGE (any Debian-based image with python3 3.11 and its venv module;
# .ci/images builds one from Debian's packages) and TORCH_INDEX (where the CPU build of torch
# comes from, for the export stage). pip inside the build reads /etc/pip.conf from the build
# secret `pip.conf` when one is given (a mirror, a CA bundle: `--secret id=pip.conf,src=FILE`).

ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS python

# A venv on the base's own python3: python:*-slim and Debian's python3 alike.
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ONLY_BINARY=:all: \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# ---------------------------------------------------------------------------------------------
FROM python AS export

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV OMP_NUM_THREADS=1
WORKDIR /src

# Pinned wheels only (PIP_ONLY_BINARY): CPU torch from TORCH_INDEX, the rest from the index.
COPY deploy/requirements-export.txt deploy/requirements-export.txt
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    --mount=type=cache,target=/root/.cache/pip \
    pip install --extra-index-url "$TORCH_INDEX" -r deploy/requirements-export.txt

COPY model/ model/
COPY export/ export/
COPY service/ service/
COPY checkpoints/multi30k-en-de/ checkpoints/multi30k-en-de/
COPY checkpoints/multi30k-de-en/ checkpoints/multi30k-de-en/
# Both shipped directions, each for the CPU (fp32) and for CUDA (fp16, and fp32 with the gather
# cache that ONNX Runtime's CUDA kernels read).
RUN for name in multi30k-en-de multi30k-de-en; do \
        python -m export --checkpoint "checkpoints/$name" --out "/bundles/$name-fp32" --dtype fp32 \
        && python -m export --checkpoint "checkpoints/$name" --out "/bundles/$name-fp32-cuda" \
            --dtype fp32 --cache gather \
        && python -m export --checkpoint "checkpoints/$name" --out "/bundles/$name-fp16" \
            --dtype fp16 \
        || exit 1; \
    done

# ---------------------------------------------------------------------------------------------
# The serving venvs, built here and copied whole into the images: pip and setuptools stay behind.
# What the service never reads is left out too (tests/deploy/test_image.py checks it serves):
# the packages' own test suites, pycountry's translations of names (it only maps ISO 639 codes),
# PyThaiNLP's corpora (tagger, named-entity and word-list files) beyond the two that CRFCut's
# Thai sentences read, huggingface_hub and hf-xet (tokenizers' way to download from the Hub:
# bundles carry their tokenizers), and ONNX Runtime's offline tools (graph optimisation,
# quantization: export/ uses them, at build time).
FROM python AS venv

WORKDIR /src
COPY deploy/requirements-serve.txt deploy/requirements-serve.txt
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    --mount=type=cache,target=/root/.cache/pip \
    pip install -r deploy/requirements-serve.txt \
    && site=/opt/venv/lib/python3.11/site-packages \
    && rm -r "$site/pycountry/locales" \
    && find "$site/pythainlp/corpus" -type f -size +1M ! -name sentenceseg_crfcut.model \
        ! -name words_th.txt -delete \
    && find "$site" -depth -type d -name tests -exec rm -r {} + \
    && pip uninstall --yes huggingface_hub hf-xet

FROM venv AS venv-cpu
COPY deploy/requirements-cpu.txt deploy/requirements-cpu.txt
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    --mount=type=cache,target=/root/.cache/pip \
    pip install -r deploy/requirements-cpu.txt && pip uninstall --yes pip setuptools \
    && ort=/opt/venv/lib/python3.11/site-packages/onnxruntime \
    && rm -r "$ort/transformers" "$ort/quantization" "$ort/tools"

FROM venv AS venv-gpu
COPY deploy/requirements-gpu.txt deploy/requirements-gpu.txt
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    --mount=type=cache,target=/root/.cache/pip \
    pip install -r deploy/requirements-gpu.txt && pip uninstall --yes pip setuptools \
    && ort=/opt/venv/lib/python3.11/site-packages/onnxruntime \
    && rm -r "$ort/transformers" "$ort/quantization" "$ort/tools"

# ---------------------------------------------------------------------------------------------
# What both images share: the plain base, the user, the service's sources and how it starts.
FROM ${BASE_IMAGE} AS app

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin mt

# PyThaiNLP makes its data directory when imported (in $HOME by default; the root is read-only).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    PYTHAINLP_DATA_DIR=/tmp/pythainlp-data \
    MT_HOST=0.0.0.0 \
    MT_PORT=8000 \
    MT_BUNDLES_DIR=/app/bundles \
    MT_PRECISION=auto
WORKDIR /app

# The service runs from its sources (PYTHONPATH): no torch, no model/, no export/.
COPY service/ service/
COPY deploy/docker/entrypoint.sh deploy/docker/entrypoint.sh
COPY deploy/docker/healthcheck.py deploy/docker/healthcheck.py

EXPOSE 8000
# Loading and warming up the model takes a few seconds; /ready (not this) gates traffic.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py"]
# The entrypoint execs the service (PID 1 gets SIGTERM and drains: MT_DRAIN_TIMEOUT_S).
ENTRYPOINT ["/app/deploy/docker/entrypoint.sh"]

# ---------------------------------------------------------------------------------------------
FROM app AS cpu

COPY --from=venv-cpu /opt/venv/ /opt/venv/
COPY --from=export /bundles/multi30k-en-de-fp32/ /app/bundles/multi30k-en-de-fp32/
COPY --from=export /bundles/multi30k-de-en-fp32/ /app/bundles/multi30k-de-en-fp32/
ENV MT_DEVICE=cpu
USER 10001:10001

# ---------------------------------------------------------------------------------------------
FROM app AS gpu

COPY --from=venv-gpu /opt/venv/ /opt/venv/
COPY --from=export /bundles/ /app/bundles/
USER 10001:10001
