#!/usr/bin/env bash
# On a lent GPU machine, in the project root, after benchmarks/gpu/stage.sh here; one call each:
#   carrying .gpu/p0, then .gpu/p1, ...:  bash benchmarks/gpu/run.sh receive
#   carrying .gpu/w:                      BUDGET=540 bash benchmarks/gpu/run.sh measure
# `receive` keeps the part it was sent (onnxruntime-gpu, CTranslate2; the data with p0) in
# /tmp, where it stays while the machine is warm, and the first starts writing the
# transformer-base Marian checkpoint in the background. `measure` installs, then runs the
# checks in issue 58's order (the CUDA tests first; what earlier runs measured last), each
# bounded by its own timeout and by BUDGET seconds in all: $OUT/log.txt (every stage's tail),
# $OUT/res.tar.gz (every output and JSON), $OUT/nvsmi.csv (GPU memory during the soak),
# $OUT/nvsmi_workers.csv (during the workers' loads).
# STAGES="name ..." runs only the stages named (load_workers_N for each N of WORKERS_SWEEP,
# default "1 2 4 8"). The soak's server gets --device cuda --max-batch-size 64 and SOAK_FLAGS
# (default --cuda-graphs; "" for no graphs), for SOAK_REQUESTS requests or SOAK_SECONDS seconds
# (20000, 80).
set -u
case "${1:-}" in
receive)
  mkdir -p /tmp/gpuwhl /tmp/data /tmp/marian
  cp .gpu/p*/*.part.* /tmp/gpuwhl/
  if [ -d .gpu/p0/data ]; then
    cp .gpu/p0/data/*.gz /tmp/data/
    PYTHONPATH=$PWD setsid nohup python3 -c "
import gzip; from pathlib import Path; from benchmarks.marian_checkpoint import write_base
read = lambda f: gzip.open(f'/tmp/data/{f}.gz', 'rt', encoding='utf-8').read().splitlines()
write_base(Path('/tmp/marian/hf'), read('train.en'), read('train.de'))
Path('/tmp/marian/hf.done').touch()" > /tmp/marian_prep.log 2>&1 &
  fi
  nvidia-smi -L; ls -l /tmp/gpuwhl; exit 0 ;;
measure) ;;
*) echo "usage: $0 receive|measure"; exit 2 ;;
esac
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-540}))
LOG=$OUT/log.txt; RES=/tmp/res; rm -rf $RES; mkdir -p $RES
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
pack() { tar -czf "$OUT/res.tar.gz" -C $RES . 2>/dev/null; }
wanted() {  # wanted NAME...: whether STAGES is unset or names one of them
  [ -z "${STAGES:-}" ] && return 0
  local name; for name in "$@"; do [[ " $STAGES " == *" $name "* ]] && return 0; done; return 1
}
stage() {  # stage NAME SECONDS CMD...: skipped when STAGES is set and does not name it
  local name=$1 limit=$2; shift 2
  wanted "$name" || return
  local left=$((DEADLINE - $(date +%s)))
  [ $left -lt 15 ] && { say "SKIP $name (no time left)"; return; }
  [ "$limit" -gt $left ] && limit=$left
  say "START $name (limit ${limit}s)"
  timeout -k 5 "$limit" "$@" > "$RES/$name.txt" 2>&1; local rc=$?
  say "END $name rc=$rc"; grep -v "plugin EP device" "$RES/$name.txt" | tail -n "${TAILN:-40}" >> "$LOG"; pack
}
cat /tmp/gpuwhl/ort.part.* > /tmp/ort.tar.xz
echo "$(cat .gpu/w/ort.sha256)  /tmp/ort.tar.xz" | sha256sum -c - >> "$LOG" 2>&1 || { say "sha256 mismatch"; exit 1; }
mkdir -p /tmp/ortsite && python3 -c "import tarfile; tarfile.open('/tmp/ort.tar.xz').extractall('/tmp/ortsite', filter='data')" \
  || { say "onnxruntime-gpu did not unpack"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .gpu/w/whl/*.whl >> "$LOG" 2>&1 \
  || { say "the serving wheels did not install"; exit 1; }
CT2_SITE=; CT2_LIB=  # CTranslate2 and its cuBLAS 12, where stage.sh sent them: else its systems are skipped
if [ -f .gpu/w/ct2.sha256 ]; then
  cat /tmp/gpuwhl/ct2.part.* > /tmp/ct2.tar.xz 2>/dev/null
  if echo "$(cat .gpu/w/ct2.sha256)  /tmp/ct2.tar.xz" | sha256sum -c - >> "$LOG" 2>&1 && mkdir -p /tmp/ct2 \
    && python3 -c "import tarfile; tarfile.open('/tmp/ct2.tar.xz').extractall('/tmp/ct2', filter='data')"; then
    CT2_SITE=/tmp/ct2/site: CT2_LIB=:/tmp/ct2/lib
  else say "CTranslate2 did not arrive whole: its systems are skipped"; fi
fi
libs=$(find / -xdev \( -name 'libcudnn.so.9' -o -name 'libcublasLt.so.13' -o -name 'libcufft.so.12' \
  -o -name 'libcurand.so.10' -o -name 'libcudart.so.13' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:)
export PYTHONPATH=/tmp/ortsite:/tmp/site:$CT2_SITE$PWD PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=${libs}${CT2_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MULTI30K_DIR=/tmp/data
mkdir -p ../shared/data && ln -sfn /tmp/data ../shared/data/multi30k
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import onnxruntime as o, torch; print('onnxruntime', o.__version__, o.get_available_providers()); print('torch', torch.__version__, torch.version.cuda)"
  [ -n "$CT2_SITE" ] && python3 -c "import ctranslate2 as c; print('ctranslate2', c.__version__, 'CUDA devices', c.get_cuda_device_count())"
  echo "cores $(nproc)"; } >> "$LOG" 2>&1
python3 -c "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers()" || { say "no CUDA provider"; exit 1; }
SRC=/tmp/data/test_2016_flickr.en.gz; B=/tmp/bundles; M=/tmp/marian; mkdir -p $B
zcat $SRC > /tmp/texts.txt
stage export 60 python3 -c "
from pathlib import Path; from export.onnx_export import export_bundle
c = Path('checkpoints/multi30k-en-de')
export_bundle(c, Path('$B/fp32'), cache='gather'); export_bundle(c, Path('$B/fp16'), dtype='fp16')
export_bundle(c, Path('$B/cpu')); print('exported')"
stage test_cuda 90 python3 -m pytest -m gpu tests/service/test_cuda.py -q -p no:cacheprovider --durations=5
# Issue 58, in its order. CTranslate2 on the card (never run yet): the transformer-base Marian
# that `receive` started writing, in fp16 against CTranslate2's float16 and int8_float16.
if wanted marian_export; then
  for i in $(seq 60); do [ -f $M/hf.done ] && break; sleep 1; done
  cat /tmp/marian_prep.log >> "$LOG"
fi
stage marian_export 90 python3 -c "
from pathlib import Path; from model.importers import marian; from export.onnx_export import export_bundle
m = Path('$M'); (m / 'ckpt').exists() or marian.import_checkpoint(m / 'hf', m / 'ckpt')
export_bundle(m / 'ckpt', m / 'fp32', cache='gather'); export_bundle(m / 'ckpt', m / 'fp16', dtype='fp16')"
TAILN=20 stage bench_ct2 150 python3 -m benchmarks.gpu_bench --checkpoint $M/ckpt --hf-dir $M/hf --src $SRC \
  --n 64 --length 32 --batch-sizes 1 32 --beam-sizes 4 --repeat 1 --threads 8 --systems engine-fp32 \
  engine-fp16 engine-fp16-graphs ct2-fp16 ct2-int8-fp16 --bundle-fp32 $M/fp32 --bundle-fp16 $M/fp16 \
  --bundle-cpu $M/fp32 --json $RES/gpu_bench_ct2.json
# The service at the card's pace: WORKERS_SWEEP processes (1 2 4 8), CUDA graphs on, the clients
# over 4 processes, batching only; each level's mean batch (over the workers) shows whether the
# workers split the batches, $OUT/nvsmi_workers.csv the GPU's memory and use for each count.
SWEEP=(${WORKERS_SWEEP:-1 2 4 8})
if wanted "${SWEEP[@]/#/load_workers_}"; then
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 1 > "$OUT/nvsmi_workers.csv" 2>&1 & SMI=$!
fi
for n in "${SWEEP[@]}"; do
  wanted load_workers_$n && echo "# workers $n from $(date +%T) (nvidia-smi's clock)" >> "$LOG"
  TAILN=8 stage load_workers_$n 60 env MT_CUDA_GRAPHS=true MT_WORKERS=$n python3 -m benchmarks.load_bench \
    --bundle $B/fp16 --concurrency 1,128,256 --duration 5 --max-requests 30000 --max-batch-size 128 \
    --client-processes 4 --batching-only --texts /tmp/texts.txt --json $RES/load_workers_$n.json
done
kill ${SMI:-} 2>/dev/null; SMI=
# Kernels a step, replayed (graphs on) and profiled (graphs off), batch 1 and 64.
TAILN=30 stage profile 60 python3 -m benchmarks.step_profile --device cuda --bundle $B/fp16 --src $SRC --n 128 \
  --threads 1 --batch-sizes 1 64 --beam-sizes 1 4 --repeat 2 --ort-profile --json $RES/profile.json
TAILN=12 stage profile_graphs 50 python3 -m benchmarks.step_profile --device cuda --cuda-graphs --bundle $B/fp16 \
  --src $SRC --n 128 --threads 1 --batch-sizes 1 64 --beam-sizes 1 4 --repeat 2 --json $RES/profile_graphs.json
# A document of about 300 pages (3,400 paragraphs of three sentences) beside interactive requests.
TAILN=40 stage documents 120 python3 -m benchmarks.document_bench --bundle $B/fp16 --paragraphs 3400 \
  --document-batch-size 128 --repeat 1 --probe-s 3 --poll-s 0.2 \
  --server-args "--device cuda --cuda-graphs --max-batch-size 128" --json $RES/documents.json
# The graph bound under a soak (GPU memory every second; SOAK_REQUESTS=100000 SOAK_SECONDS=200
# with STAGES="export soak" for the soak, a call of its own).
wanted soak && { nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 1 > "$OUT/nvsmi.csv" 2>&1 & SMI=$!; }
SOAK_SECONDS=${SOAK_SECONDS:-80}
TAILN=12 stage soak $((SOAK_SECONDS + 20)) python3 -m benchmarks.soak --bundle $B/fp16 --requests ${SOAK_REQUESTS:-20000} \
  --clients 64 --texts /tmp/texts.txt --warmup 1000 --rss-every 2 --max-seconds $SOAK_SECONDS \
  --server-args "--device cuda --max-batch-size 64 ${SOAK_FLAGS---cuda-graphs}" --json $RES/soak.json
kill ${SMI:-} 2>/dev/null
# The README's GPU tables, as in the earlier runs.
TAILN=45 stage bench_shipped 170 python3 -m benchmarks.gpu_bench --src $SRC --n 1000 --batch-sizes 64 256 \
  --beam-sizes 1 4 --repeat 1 --threads 8 --bundle-fp32 $B/fp32 --bundle-fp16 $B/fp16 --bundle-cpu $B/cpu \
  --json $RES/gpu_bench_shipped.json
TAILN=25 stage bench_b1 80 python3 -m benchmarks.gpu_bench --src $SRC --n 100 --batch-sizes 1 --beam-sizes 1 4 \
  --repeat 1 --systems engine-fp32 engine-fp32-graphs engine-fp16 engine-fp16-graphs torch-cached \
  --bundle-fp32 $B/fp32 --bundle-fp16 $B/fp16 --bundle-cpu $B/cpu --json $RES/gpu_bench_b1.json
TAILN=30 stage bench_marian 150 python3 -m benchmarks.gpu_bench --checkpoint $M/ckpt --src $SRC --n 64 --length 32 \
  --batch-sizes 1 64 --beam-sizes 1 4 --repeat 1 --threads 8 --systems engine-fp32 engine-fp32-graphs \
  engine-fp16 engine-fp16-graphs torch-cached torch-uncached \
  --bundle-fp32 $M/fp32 --bundle-fp16 $M/fp16 --bundle-cpu $M/fp32 --json $RES/gpu_bench_marian.json
say "DONE"; pack
