#!/usr/bin/env bash
# scripts/gpu-session.sh OUT — every GPU check of one device call, in order.
#
# Runs on the lent GPU machine from the repository root, with the bundle
# that scripts/gpu-bundle.sh made in .device/ (carried).  Each step has its
# own time limit and its own exit status in the log, so one failure does not
# hide the rest.  Writes OUT/log.txt (everything), OUT/bench.jsonl (JSON
# lines of the benchmarks) and OUT/metrics-*.jsonl.
#   STEPS=tests,jobs,train,pool  (default: all) picks steps.
set -u
out=${1:?usage: gpu-session.sh OUT}
steps=${STEPS:-tests,jobs,train,pool}
top=$(pwd)
B=$top/.device/bin
exec > >(tee -a "$out/log.txt") 2>&1
want() { [[ ",$steps," == *",$1,"* ]]; }
section() { echo; echo "=== $* ($(date +%T))"; }
gx() { ( . "$top/.device/env.sh"; "$@" ); }   # gradd's programs with the bundled libraries

section machine
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'

if want tests; then
  section test_gpu_dev
  gx timeout 120 "$B/tests/gpu/test_gpu_dev" "$B/daemon/gradd-cuda.so"; echo "rc=$?"
  section test_gpu_kernels
  gx timeout 150 "$B/tests/gpu/test_gpu_kernels" "$B/daemon/gradd-cuda.so"; echo "rc=$?"
fi

if want jobs; then
  # The same small GPT on fortunes: cpu fp32 as the reference, cuda in each precision.
  for run in cpu:fp32 cuda:0:fp32 cuda:0:bf16 cuda:0:fp16; do
    dev=${run%:*}; prec=${run##*:}; tag=${dev//:/}-$prec
    cat >/tmp/job-$tag.cfg <<CFG
[job]
name = tiny-$tag
device = $dev
[model]
type = gpt
layers = 4
heads = 4
width = 128
context = 128
vocab = 256
[data]
format = text
train = $top/.device/data/fortunes
val_fraction = 0.02
[train]
steps = 200
batch = 16
micro_batch = 16
lr = 2e-3
min_lr = 2e-4
warmup = 30
grad_clip = 1.0
seed = 1337
precision = $prec
threads = 8
eval_every = 100
eval_batches = 20
[output]
dir = /tmp/out-$tag
checkpoint_every = 100
log_every = 50
CFG
    section "gradd run tiny GPT $tag"
    gx timeout 180 "$B/daemon/gradd" run /tmp/job-$tag.cfg; echo "rc=$?"
    cp /tmp/out-$tag/metrics.jsonl "$out/metrics-$tag.jsonl" 2>/dev/null
  done
fi

if want train; then
  section "GPT-2 124M bf16: gradd vs PyTorch"
  GRADD_ENV=$top/.device/env.sh METRICS_COPY=$out/metrics-gpt2.jsonl \
    timeout 300 bench/run_gpu_train.sh "$B/daemon/gradd" 30 | tee -a "$out/bench.jsonl"; echo "rc=${PIPESTATUS[0]}"
fi

if want pool && [ -x bench/run_gpu_pool.sh ] && [ -x "$B/bench/bench_pool_cuda" ]; then
  section "pool trace on cuda"
  GRADD_ENV=$top/.device/env.sh timeout 300 bench/run_gpu_pool.sh "$B" | tee -a "$out/bench.jsonl"; echo "rc=${PIPESTATUS[0]}"
fi
section end
