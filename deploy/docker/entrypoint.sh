#!/bin/sh
# Container entrypoint: pick the bundle for the device, then exec `python -m service`.
#
#   MT_BUNDLE          set: used as it is (comma-separated bundle dirs); nothing below applies.
#   MT_DEVICE          auto (default) | cpu | cuda: auto with no GPU visible becomes cpu.
#   MT_PRECISION       auto (default) | fp32 | fp16: which prebuilt bundle to serve.
#                      auto: fp16 when a GPU is visible (/dev/nvidiaN, as `docker run --gpus`
#                      and the Kubernetes device plugin provide) and MT_DEVICE is not cpu;
#                      fp32 otherwise (fp16 on the CPU provider is slow). fp32 on a GPU
#                      serves $MT_BUNDLE_NAME-fp32-cuda, exported with the cache the CUDA provider
#                      needs (--cache gather; the CPU's fp32 bundle uses the indirection).
#   MT_BUNDLES_DIR     where the image keeps its bundles (default /app/bundles)
#   MT_BUNDLE_NAME     bundle name prefixes, comma-separated (default: both shipped directions,
#                      multi30k-en-de,multi30k-de-en): $MT_BUNDLES_DIR/NAME-fp32 for each
#                      (MT_MODEL is the service's: transformers checkpoint folders, --model)
#
# Every other MT_* variable and any argument go to the service unchanged. Without a GPU the
# same image runs on ONNX Runtime's CPU provider; the engine logs the provider it uses.
set -eu

if [ -z "${MT_BUNDLE:-}" ]; then
    bundles_dir="${MT_BUNDLES_DIR:-/app/bundles}"
    names="${MT_BUNDLE_NAME:-multi30k-en-de,multi30k-de-en}"
    precision="${MT_PRECISION:-auto}"
    gpu=no
    if [ "${MT_DEVICE:-auto}" = "cuda" ]; then
        gpu=yes
    elif [ "${MT_DEVICE:-auto}" = "auto" ]; then
        for device in /dev/nvidia[0-9]*; do
            if [ -e "$device" ]; then
                gpu=yes
                break
            fi
        done
    fi
    if [ "$gpu" = no ] && [ "${MT_DEVICE:-auto}" = "auto" ]; then
        # No GPU visible: the CPU, said outright, so that the gpu image's onnxruntime-gpu does
        # not try (and fail, loudly) to open a CUDA session first.
        export MT_DEVICE=cpu
    fi
    case "$precision" in
        auto) variant=$([ "$gpu" = yes ] && echo fp16 || echo fp32) ;;
        fp32) variant=$([ "$gpu" = yes ] && echo fp32-cuda || echo fp32) ;;
        fp16) variant=fp16 ;;
        *)
            echo "entrypoint: MT_PRECISION must be auto, fp32 or fp16, not '$precision'" >&2
            exit 2
            ;;
    esac
    MT_BUNDLE=""
    for name in $(echo "$names" | tr ',' ' '); do
        bundle="$bundles_dir/$name-$variant"
        if [ ! -f "$bundle/manifest.json" ]; then
            echo "entrypoint: no bundle at $bundle (set MT_BUNDLE or MT_BUNDLES_DIR)" >&2
            exit 2
        fi
        MT_BUNDLE="${MT_BUNDLE:+$MT_BUNDLE,}$bundle"
    done
    export MT_BUNDLE
    echo "entrypoint: serving $MT_BUNDLE ($variant, MT_DEVICE=${MT_DEVICE:-auto})" >&2
fi

exec python -m service "$@"
