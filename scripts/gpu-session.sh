#!/usr/bin/env bash
# scripts/gpu-session.sh OUT — every GPU check of one device call, in order.
#
# Runs on the lent GPU machine from the repository root, with the bundle
# that scripts/gpu-bundle.sh made (.device.tar.xz, carried; unpacked here
# into .device/).  Each step has its own time limit and its own exit status
# in the log, so one failure does not hide the rest.  Writes OUT/log.txt
# (everything), OUT/bench.jsonl (JSON lines of the benchmarks) and
# OUT/metrics-*.jsonl.
#   STEPS=tests,jobs,kernels,daemon,train,pool  (default: all) picks steps;
#   LLAMA_VARIANTS the llama step's gradd-only reruns (mma cudnn fp32act);
#   nvml (about 30 s), idle (about 40 s), alloc (about 40 s), shim and
#   llama (bench/llama, about 4 minutes) run only when named:
#   STEPS=nvml,idle,alloc,shim,programs,llama,hfllama,recompute,lora,dist or
#   STEPS=...,nvml.
#
# Device time is short (15 minutes a session, starting the machine
# included; 10 a call).  On an H200 (2026-11-26) the steps took: tests 15 s,
# train 60 s, jobs 35 s, kernels 10 s a run, daemon 30 s, so all but pool
# fit one call of about 3 minutes, plus 30 s to start the machine.  Every
# step's output reaches OUT as it goes, so a call cut short still returns
# what ran.
set -u
out=${1:?usage: gpu-session.sh OUT}
# The bundle travels packed (scripts/gpu-bundle.sh), and replaces what an
# earlier call unpacked (about 2 s).
if [ -f .device.tar.xz ]; then
  rm -rf .device && tar -xJf .device.tar.xz || { echo "gpu-session.sh: cannot unpack .device.tar.xz"; exit 1; }
fi
steps=${STEPS:-tests,jobs,kernels,daemon,train,pool}
top=$(pwd)
B=$top/.device/bin
exec > >(tee -a "$out/log.txt") 2>&1
want() { [[ ",$steps," == *",$1,"* ]]; }
section() { echo; echo "=== $* ($(date +%T))"; }
# gradd's programs with the bundled libraries (env.sh read once: it
# searches the machine for the CUDA libraries).
gx_ld=$( . "$top/.device/env.sh"; echo "$LD_LIBRARY_PATH")
gx() { LD_LIBRARY_PATH=$gx_ld "$@"; }
. "$top/bench/train/gpt2_job.sh"                # gpt2_job: GPT-2 124M's job sections
# The peers' Python: the one with torch (the machine's venv, if python3 on
# PATH has none).
if [ -z "${PEER_PYTHON:-}" ] && ! python3 -c 'import torch' 2>/dev/null && [ -x /opt/torch/.venv/bin/python3 ]; then
  export PEER_PYTHON=/opt/torch/.venv/bin/python3
fi
py=${PEER_PYTHON:-python3}

section machine
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
"$py" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
echo "LD_LIBRARY_PATH for gradd: $gx_ld"

if want tests; then
  section test_gpu_dev
  gx timeout 120 "$B/tests/gpu/test_gpu_dev" "$B/daemon/gradd-cuda.so"; echo "rc=$?"
  # Once per attention kernel (GRADD_FLASH, read when a context is created).
  for flash in ${FLASHES:-mma wmma}; do
    section "test_gpu_kernels GRADD_FLASH=$flash"
    GRADD_FLASH=$flash gx timeout 150 "$B/tests/gpu/test_gpu_kernels" "$B/daemon/gradd-cuda.so"; echo "rc=$?"
  done
  # And Llama's attention on the tensor cores (gqa_mma.cu) and on cuDNN,
  # which are opt-in.  cuDNN says on stderr which shapes it planned.
  section "test_gpu_kernels GRADD_GQA=mma"
  GRADD_GQA=mma gx timeout 150 "$B/tests/gpu/test_gpu_kernels" "$B/daemon/gradd-cuda.so"; echo "rc=$?"
  section "test_cudnn_sdpa and test_gpu_kernels GRADD_GQA=cudnn"
  gx timeout 120 "$B/tests/gpu/test_cudnn_sdpa"; echo "rc=$?"
  GRADD_GQA=cudnn gx timeout 150 "$B/tests/gpu/test_gpu_kernels" "$B/daemon/gradd-cuda.so"; echo "rc=$?"
fi

if want jobs; then
  # The same small GPT on fortunes: cpu fp32 as the reference, cuda in each precision.
  # Then with 2 heads of 64 (the fused attention's head size) in bf16, once
  # per attention kernel: the two must train alike.
  for run in cpu:fp32 cuda:0:fp32 cuda:0:bf16 cuda:0:fp16 cuda:0:bf16:wmma cuda:0:bf16:mma; do
    flash=mma heads=4
    case $run in *:wmma|*:mma) flash=${run##*:}; run=${run%:*}; heads=2 ;; esac
    dev=${run%:*}; prec=${run##*:}; tag=${dev//:/}-$prec
    [ $heads = 2 ] && tag=$tag-h2-$flash
    cat >/tmp/job-$tag.cfg <<CFG
[job]
name = tiny-$tag
device = $dev
[model]
type = gpt
layers = 4
heads = $heads
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
    GRADD_FLASH=$flash gx timeout 180 "$B/daemon/gradd" run /tmp/job-$tag.cfg; echo "rc=$?"
    cp /tmp/out-$tag/metrics.jsonl "$out/metrics-$tag.jsonl" 2>/dev/null
  done
fi

if want kernels || want llama; then
  # Llama's attention at the 1B shape, head sizes 64 and 128: the
  # tensor-core kernels (GRADD_GQA=mma) and cuDNN's (directly, and as the
  # model calls it with GRADD_GQA=cudnn) against gqa.cu's: which decides
  # the default.
  for shape in "4 2048 32 8 64" "2 2048 16 4 128"; do
    section "gqa kernels bf16, B T NH KVH HS = $shape"
    gx timeout 60 "$B/bench/kernels/bench_gqa_cuda" "$B/daemon/gradd-cuda.so" bf16 $shape | tee -a "$out/bench.jsonl"
    echo "rc=${PIPESTATUS[0]}"
  done
  # Where a Llama 3.2 1B-shaped bf16 step's time goes, op by op, with each
  # attention kernel (bench_llama_kernels.c).
  for gqa in default mma cudnn; do
    section "llama kernels bf16 at Llama 3.2 1B, GRADD_GQA=$gqa"
    GRADD_GQA=$gqa gx timeout 120 "$B/bench/kernels/bench_llama_kernels_cuda" "$B/daemon/gradd-cuda.so" bf16 |
      sed "s/\"bench\": *\"/&gqa_$gqa-/" | tee -a "$out/bench.jsonl"; echo "rc=${PIPESTATUS[0]}"
  done
fi

if want kernels; then
  # Where a GPT-2 124M step's time goes, op by op (B=16 T=1024).
  # KERNEL_RUNS picks PRECISION:FLASH pairs.
  for run in ${KERNEL_RUNS:-bf16:mma bf16:wmma fp32:mma}; do
    prec=${run%:*} flash=${run#*:}
    section "kernels $prec at GPT-2 124M, GRADD_FLASH=$flash"
    GRADD_FLASH=$flash gx timeout 120 "$B/bench/kernels/bench_kernels_cuda" "$B/daemon/gradd-cuda.so" $prec 16 1024 768 12 50304 12 |
      sed "s/\"bench\": *\"/&$flash-/" | tee -a "$out/bench.jsonl"; echo "rc=${PIPESTATUS[0]}"
  done
fi

if want daemon; then
  # The daemon on the GPU: the example jobs in both 16-bit precisions through gradctl.
  section "daemon: etc/jobs/fortunes-gpt-{bf16,fp16}.cfg on cuda0"
  sock=/tmp/gradd-gpu.sock
  ( . "$top/.device/env.sh"; setsid "$B/daemon/gradd" -s $sock --state-dir /tmp/gradd-state >/tmp/gradd.log 2>&1 & )
  for i in $(seq 50); do [ -S $sock ] && break; sleep 0.2; done
  for prec in bf16 fp16; do
    sed -e "s#^train = .*#train = $top/.device/data/fortunes#" -e "s#^dir = .*#dir = /tmp/runs/fortunes-gpt-$prec#" \
      etc/jobs/fortunes-gpt-$prec.cfg >/tmp/fortunes-gpt-$prec.cfg
    id=$(gx "$B/client/gradctl" -s $sock submit /tmp/fortunes-gpt-$prec.cfg | grep -o '[0-9]\+' | head -1)
    echo "submitted $prec as job $id"
    gx timeout 240 "$B/client/gradctl" -s $sock watch "$id" | tail -5
    gx "$B/client/gradctl" -s $sock status "$id"
  done
  echo "--- gradctl sample (the bf16 model, generated on the CPU by the daemon)"
  gx "$B/client/gradctl" -s $sock sample 1 --tokens 300 --seed 1 --prompt "The "
  # Adaptive batching on the GPU: GPT-2 124M under a 12 GiB budget, batch 64
  # of 1024 tokens: the controller probes the micro-batch that fits.
  "$py" bench/train/make_tokens.py /tmp/tokens.bin $((1 << 21))
  { gpt2_job gpt2-auto /tmp/tokens.bin; cat <<CFG
[train]
steps = 12
batch = 64
micro_batch = auto
warmup = 2
precision = bf16
[memory]
limit = 12G
[output]
dir = /tmp/runs/gpt2-auto
log_every = 1
CFG
  } >/tmp/gpt2-auto.cfg
  id=$(gx "$B/client/gradctl" -s $sock submit /tmp/gpt2-auto.cfg | grep -o '[0-9]\+' | head -1)
  gx timeout 240 "$B/client/gradctl" -s $sock watch "$id" | tail -3
  gx "$B/client/gradctl" -s $sock status "$id"
  grep -h batch_change /tmp/runs/gpt2-auto/metrics.jsonl | head -5
  gx "$B/client/gradctl" -s $sock status
  gx "$B/client/gradctl" -s $sock stats
  gx "$B/client/gradctl" -s $sock list
  pkill -TERM -f "gradd -s $sock"; sleep 1
  echo "--- gradd log"; tail -30 /tmp/gradd.log
fi

if want train; then
  section "GPT-2 124M bf16: gradd vs PyTorch"
  VARIANTS=${VARIANTS:-default wmma:GRADD_FLASH=wmma fp32act:GRADD_ACT16=0} GRADD_ENV=$top/.device/env.sh METRICS_DIR=$out \
    timeout 400 bench/train/run_gpu.sh "$B/daemon/gradd" 30 | tee -a "$out/bench.jsonl"; echo "rc=${PIPESTATUS[0]}"
fi

if want llama; then
  # Named only (STEPS=llama or ...,llama): Llama 3.2 1B's shape is about
  # 4 minutes of device time with both peers.
  section "Llama 3.2 1B-shaped bf16: gradd vs PyTorch"
  GRADD_ENV=$top/.device/env.sh METRICS_DIR=$out \
    timeout 500 bench/llama/run_gpu.sh "$B/daemon/gradd" 15 | tee -a "$out/bench.jsonl"; echo "rc=${PIPESTATUS[0]}"
  # gradd alone again with each variant of LLAMA_VARIANTS (default: mma
  # cudnn): the attention on the tensor cores (gqa_mma.cu, GRADD_GQA=mma),
  # on cuDNN's fused attention (GRADD_GQA=cudnn), or (fp32act) with fp32
  # activations, GRADD_ACT16=0: what model_llama.c's 16-bit ones save.
  for variant in ${LLAMA_VARIANTS:-mma cudnn}; do
    case $variant in
      mma) venv=GRADD_GQA=mma tag=gqa_mma ;;
      cudnn) venv=GRADD_GQA=cudnn tag=gqa_cudnn ;;
      fp32act) venv=GRADD_ACT16=0 tag=fp32act ;;
      *) echo "unknown LLAMA_VARIANTS entry $variant"; continue ;;
    esac
    section "Llama 3.2 1B-shaped bf16: gradd with $venv"
    env "$venv" PEER_MODES=none GRADD_ENV=$top/.device/env.sh \
      timeout 200 bench/llama/run_gpu.sh "$B/daemon/gradd" 15 2>&1 >/tmp/llama-$tag.jsonl | grep -E "cuDNN|error|fail" | head -5
    sed "s/\"bench\": *\"/&$tag-/" /tmp/llama-$tag.jsonl | tee -a "$out/bench.jsonl"
  done
fi

if want hfllama; then
  # Issue 21's round trip on the GPU: a bf16 Llama directory imported,
  # fine-tuned on cuda:0 on masked jsonl samples, exported, loaded by the
  # machine's transformers, whose loss, logits and greedy tokens must be
  # gradd's (tests/integration/test_hf_llama.py).
  section "hfllama: Hugging Face Llama round trip on cuda:0"
  GRADD_TEST_DEVICE=cuda:0 GRADD_BIN=$B/daemon/gradd GRADCTL_BIN=$B/client/gradctl \
    MODEL_PROBE=$B/tests/unit/model_probe GRADD_SOURCE_ROOT=$top PYTHONPATH=$top/tests/integration \
    PYTHONDONTWRITEBYTECODE=1 LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$gx_ld \
    timeout 300 "$py" tests/integration/test_hf_llama.py
  echo "rc=$?"
fi

if want recompute; then
  # Issue 22: a full bf16 fine-tune of Llama 3.2 1B's shape at micro-batch
  # 1 under [memory] limit = 24G: without recompute it must not fit (the
  # job fails at micro-batch 1), with it the steps run.
  section "recompute: Llama 1B-shaped full fine-tune under a 24G limit"
  "$py" bench/train/make_tokens.py /tmp/rc-tokens.bin
  for rc in off on; do
    cat >/tmp/job-rc-$rc.cfg <<CFG
[job]
name = rc-$rc
device = cuda:0
[model]
type = llama
layers = 16
heads = 32
kv_heads = 8
width = 2048
mlp_width = 8192
context = 2048
vocab = 128256
rope_theta = 500000
tie_embeddings = on
[data]
format = tokens
train = /tmp/rc-tokens.bin
val_fraction = 0
[train]
steps = 3
batch = 1
micro_batch = 1
precision = bf16
[memory]
limit = 24G
recompute = $rc
[output]
dir = /tmp/out-rc-$rc
CFG
    gx timeout 240 "$B/daemon/gradd" run /tmp/job-rc-$rc.cfg 2>&1 | tail -6
    echo "recompute=$rc rc=${PIPESTATUS[0]}"
    grep -h '"step"' /tmp/out-rc-$rc/metrics.jsonl 2>/dev/null | tail -2
  done
fi

if want lora; then
  # Issue 22: LoRA on Llama 3.2 3B's shape (random init) in bf16 under
  # [memory] limit = 24G: memory by tag and tokens/s, against transformers +
  # peft capped at the same 24 GiB, in the same run (bench/lora/run_gpu.sh).
  section "lora: Llama 3B-shaped LoRA under a 24G limit, against peft"
  PEER_PYTHON=$py GRADD_ENV=$top/.device/env.sh timeout 420 bench/lora/run_gpu.sh "$B/daemon/gradd" 8 |
    tee -a "$out/bench.jsonl"
  echo "rc=${PIPESTATUS[0]}"
fi

if want dist; then
  # Issue 23's NCCL path.  One GPU: a world of one rank (--test-hooks'
  # GRADD_TEST_GROUP=1) runs every collective over NCCL, the gradients in
  # 64 KiB buckets started during the backward; its weights must be the
  # plain run's, bitwise (a sum over one rank).  Then GPT-2 124M in bf16
  # both ways for the cost of the path, and with two or more GPUs
  # [job] devices over two of them against one, for the scaling.
  section "dist: NCCL with one rank, against one process"
  for mode in plain world1; do
    cat >/tmp/job-dist-$mode.cfg <<CFG
[job]
name = dist-$mode
device = cuda:0
allreduce_bucket = 64K
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
steps = 60
batch = 16
micro_batch = 8
lr = 2e-3
seed = 1337
precision = bf16
eval_every = 60
eval_batches = 4
[memory]
shard_optimizer = on
[output]
dir = /tmp/out-dist-$mode
log_every = 20
CFG
    env=(); [ $mode = world1 ] && env=(GRADD_TEST_GROUP=1)
    env "${env[@]}" LD_LIBRARY_PATH=$gx_ld timeout 120 "$B/daemon/gradd" --test-hooks run /tmp/job-dist-$mode.cfg 2>&1 | tail -3
    echo "$mode rc=${PIPESTATUS[0]}"
    tail -2 /tmp/out-dist-$mode/metrics.jsonl
  done
  PYTHONPATH=$top/tests/integration "$py" -c 'import harness, sys; print("max weight diff world1 vs plain:", harness.max_weight_diff(sys.argv[1], sys.argv[2]))'     /tmp/out-dist-plain/model.safetensors /tmp/out-dist-world1/model.safetensors
  "$py" bench/train/make_tokens.py /tmp/dist-tokens.bin $((1 << 22))
  ngpu=$(nvidia-smi -L | wc -l)
  modes="plain world1"; [ "$ngpu" -ge 2 ] && modes="$modes devices2"
  for mode in $modes; do
    { gpt2_job gpt2-$mode /tmp/dist-tokens.bin; cat <<CFG
[train]
steps = 12
batch = 32
micro_batch = 16
warmup = 2
precision = bf16
[output]
dir = /tmp/out-gpt2-$mode
log_every = 1
CFG
    } >/tmp/job-gpt2-$mode.cfg
    [ $mode = devices2 ] && sed -i 's/^device = cuda:0$/devices = cuda:0,cuda:1/' /tmp/job-gpt2-$mode.cfg
    env=(); [ $mode = world1 ] && env=(GRADD_TEST_GROUP=1)
    section "dist: GPT-2 124M bf16 batch 32, $mode"
    env "${env[@]}" LD_LIBRARY_PATH=$gx_ld timeout 150 "$B/daemon/gradd" --test-hooks run /tmp/job-gpt2-$mode.cfg 2>&1 | tail -3
    echo "$mode rc=${PIPESTATUS[0]}"
    tail -3 /tmp/out-gpt2-$mode/metrics.jsonl
    cp /tmp/out-gpt2-$mode/metrics.jsonl "$out/metrics-gpt2-$mode.jsonl" 2>/dev/null
  done
fi

if want pool && [ -x bench/pool/run_gpu.sh ] && [ -x "$B/bench/pool/bench_pool_cuda" ]; then
  section "pool trace on cuda"
  REPEAT=${REPEAT:-3} timeout 400 bench/pool/run_gpu.sh "$top/.device/bin" | tee -a "$out/bench.jsonl"
  echo "rc=${PIPESTATUS[0]}"
fi
if want idle; then
  # An idle device gives its memory back: GPT-2 124M leaves its whole peak
  # reserved when it ends; [pool] idle_trim = 3s must return all of it.
  section "idle: GPT-2 124M's cache returned after [pool] idle_trim"
  sock=/tmp/gradd-idle.sock
  printf '[pool]\nidle_trim = 3s\n' >/tmp/gradd-idle.conf
  ( . "$top/.device/env.sh"; setsid "$B/daemon/gradd" -c /tmp/gradd-idle.conf -s $sock --state-dir /tmp/gradd-idle-state \
      >/tmp/gradd-idle.log 2>&1 & )
  for i in $(seq 50); do [ -S $sock ] && break; sleep 0.2; done
  [ -s /tmp/tokens.bin ] || "$py" bench/train/make_tokens.py /tmp/tokens.bin $((1 << 21))
  { gpt2_job gpt2-idle /tmp/tokens.bin; printf '[train]\nsteps = 5\nbatch = 16\nmicro_batch = 16\nprecision = bf16\n'
    printf '[output]\ndir = /tmp/runs/gpt2-idle\ncheckpoint_every = 0\n'; } >/tmp/gpt2-idle.cfg
  id=$(gx "$B/client/gradctl" -s $sock submit /tmp/gpt2-idle.cfg | grep -o '[0-9]\+' | head -1)
  gx timeout 120 "$B/client/gradctl" -s $sock watch "$id" | tail -1
  gx "$B/client/gradctl" -s $sock --json stats -d cuda0 >/tmp/idle-0.json
  sleep 6
  gx "$B/client/gradctl" -s $sock --json stats -d cuda0 >/tmp/idle-1.json
  gx "$B/client/gradctl" -s $sock stats -d cuda0 | grep -i -E "reserved memory|trims"
  "$py" - <<'PY'
import json
def pool(p):
    return json.load(open(p))["pools"][0]
a, b = pool("/tmp/idle-0.json"), pool("/tmp/idle-1.json")
ra, rb = a["reserved_bytes"]["all"]["current"], b["reserved_bytes"]["all"]["current"]
print("idle: reserved at the end %.2f GiB, 6 s later %.2f GiB; idle trims %d, %.2f GiB"
      % (ra / 2**30, rb / 2**30, b["idle_trims"], b["idle_trimmed_bytes"] / 2**30))
print("idle:", "PASS" if ra > 0 and rb == 0 and b["idle_trims"] == 1 else "FAIL")
PY
  kill "$(pgrep -f "gradd -c /tmp/gradd-idle.conf")" 2>/dev/null
fi
if want alloc; then
  # PyTorch on gradd's pool: libgradd-alloc as the program's CUDA
  # allocator.  An OOM must arrive as an exception, and a GPT-2 124M step
  # must cost what it costs on PyTorch's caching allocator.
  section "alloc: PyTorch with libgradd-alloc"
  lib=$B/alloc/libgradd-alloc.so
  GRADD_ALLOC_LIB=$lib LD_LIBRARY_PATH=$gx_ld timeout 120 "$py" bench/alloc/with_gradd_alloc.py "$lib" \
    bench/alloc/oom_smoke.py
  echo "rc=$?"
  LD_LIBRARY_PATH=$gx_ld PEER_PYTHON=$py timeout 300 bench/alloc/run_gpu.sh "$lib" | tee -a "$out/bench.jsonl"
  echo "rc=${PIPESTATUS[0]}"
fi
if want shim; then
  # A program job's PyTorch as gradd sets it up: python/ on PYTHONPATH and
  # GRADD_ALLOC_LIB, so that `import torch` installs the allocator.  It
  # trains eager and compiled, its memory functions answer from the pool,
  # and an OOM is a catchable "CUDA out of memory." error
  # (tests/python/test_shim_gpu.py; it fails rather than skips here).  The
  # machine's libraries come first: the bundle's Debian ones only fill in
  # what the library needs beyond torch's (jansson).
  section "shim: PyTorch on gradd's allocator through python/sitecustomize.py"
  GRADD_TEST_REQUIRE_GPU=1 GRADD_TEST_ALLOC_LIB=$B/alloc/libgradd-alloc.so GRADD_TEST_PYTHON_DIR=$top/python \
    LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$top/.device/lib PYTHONDONTWRITEBYTECODE=1 \
    timeout 300 "$py" tests/python/test_shim_gpu.py
  echo "rc=$?"
fi
if want programs; then
  # Program jobs on one GPU (tests/gpu/programs/).  A holder caches 60% of
  # the device and stays; then a second program needs 60%.  On gradd's
  # pool the daemon has the holder give its cache back and the second runs;
  # with PyTorch's own allocator (allocator = pytorch) the same pair OOMs.
  # Then a Hugging Face Trainer fine-tune as a program job, with its pool
  # in gradctl stats while it trains.
  section "programs: two PyTorch programs on one GPU, and the HF Trainer"
  sock=/tmp/gradd-prog.sock
  ctl() { gx "$B/client/gradctl" -s $sock "$@"; }
  printf '[daemon]\nmax_jobs_per_device = 4\n[pool]\nidle_trim = 0\n' >/tmp/gradd-prog.conf
  ( . "$top/.device/env.sh"; setsid "$B/daemon/gradd" -c /tmp/gradd-prog.conf -s $sock \
      --state-dir /tmp/gradd-prog-state >/tmp/gradd-prog.log 2>&1 & )
  for i in $(seq 50); do [ -S $sock ] && break; sleep 0.2; done
  # The library's own needs beyond torch's (jansson) from the bundle.
  jobenv="LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$top/.device/lib"
  progjob() {  # name allocator args...
    local name=$1 alloc=$2; shift 2
    printf '[job]\nname = %s\ntype = program\ndevice = cuda:0\n[program]\ncommand = %s %s\nworkdir = /tmp\nallocator = %s\nenv = %s\ngrace = 2s\n%b' \
      "$name" "$py" "$*" "$alloc" "$jobenv" "${PROG_EXTRA:-}" >/tmp/job-$name.cfg
    ctl submit /tmp/job-$name.cfg | grep -o '[0-9]\+' | head -1
  }
  # A job's state, or "gone" where there is none (its submission failed):
  # every wait below ends on it rather than running out its time.
  state() {
    [ -n "$1" ] && ctl --json status "$1" 2>/dev/null |
      "$py" -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null || echo gone
  }
  for alloc in gradd pytorch; do
    hold=$(progjob hold-$alloc $alloc "$top/tests/gpu/programs/pair.py hold 0.6 60")
    for i in $(seq 150); do [ "$(state "$hold")" = gone ] && break; ctl logs "$hold" | grep -q '^cached' && break; sleep 0.2; done
    ctl logs "$hold" | tail -3
    [ $alloc = gradd ] && ctl stats -d cuda0 | grep -E "program job|Reserved memory" | head -4
    need=$(progjob need-$alloc $alloc "$top/tests/gpu/programs/pair.py need 0.6")
    for i in $(seq 300); do case $(state "$need") in completed|failed|gone) break ;; esac; sleep 0.2; done
    echo "--- $alloc: need job $need $(state "$need")"; ctl logs "$need" | tail -3
    [ $alloc = gradd ] && ctl --json stats -d cuda0 >/tmp/prog-stats.json
    echo "$alloc $(state "$need")" >>/tmp/prog-pair.txt
    ctl cancel "$hold" >/dev/null
    for i in $(seq 100); do case $(state "$hold") in running) sleep 0.2 ;; *) break ;; esac; done
  done
  "$py" - <<'PY'
import json
res = dict(line.split() for line in open("/tmp/prog-pair.txt"))
pools = [p for p in json.load(open("/tmp/prog-stats.json"))["pools"] if p["job"]]
for p in pools:
    print("programs: job %d pool: allocated %.2f GiB reserved %.2f GiB trims %d retries %d ooms %d reclaims %d"
          % (p["job"], p["allocated_bytes"]["all"]["current"] / 2**30, p["reserved_bytes"]["all"]["current"] / 2**30,
             p["trims"], p["alloc_retries"], p["ooms"], p["reclaims"]))
ok = res.get("gradd") == "completed" and res.get("pytorch") == "failed"
print("programs: pair with gradd's pool %s, with PyTorch's allocator %s:" % (res.get("gradd"), res.get("pytorch")),
      "PASS" if ok else "FAIL")
PY
  rm -f /tmp/prog-pair.txt
  # Batch 512 does not fit a 1 GiB budget: the Trainer halves it on
  # gradd's OOM, and gradctl status shows each size.
  hf=$(PROG_EXTRA='[memory]\nlimit = 1G\n' progjob hf-trainer gradd \
    "$top/tests/gpu/programs/hf_trainer.py $top/.device/data/fortunes /tmp/out-hf 512")
  for i in $(seq 100); do case $(state "$hf") in running|completed|failed|gone) break ;; esac; sleep 0.2; done
  [ "$(state "$hf")" = running ] && sleep 8
  ctl stats -d cuda0 | grep -E "program job|Allocated memory|Reserved memory" | head -6
  ctl status "$hf" | head -20
  for i in $(seq 600); do case $(state "$hf") in completed|failed|cancelled|gone) break ;; esac; sleep 0.2; done
  echo "--- hf trainer: $(state "$hf")"; ctl logs "$hf" | grep -v Warning | tail -12
  ctl status "$hf" | grep -i -E "batch|change|memory|reason"
  gpid=$(ctl --json status | "$py" -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
  kill -TERM "$gpid" 2>/dev/null; sleep 1
  echo "--- gradd log"; tail -8 /tmp/gradd-prog.log
fi
if want nvml; then
  # Everyone on the GPU: while a gradd job trains on cuda0, a PyTorch
  # process holds 4 GiB there.  status must list both (gradd by its job,
  # the other by pid, user and command, with its memory), and top show
  # them in its frame.
  section "nvml: gradctl status and top with another process on the GPU"
  sock=/tmp/gradd-nvml.sock
  ctl() { gx "$B/client/gradctl" -s $sock "$@"; }
  ( . "$top/.device/env.sh"; setsid "$B/daemon/gradd" -s $sock --state-dir /tmp/gradd-nvml-state >/tmp/gradd-nvml.log 2>&1 & )
  for i in $(seq 50); do [ -S $sock ] && break; sleep 0.2; done
  "$py" -c "import torch,time; x=torch.empty(2**30, device='cuda'); torch.cuda.synchronize(); print('holder ready', flush=True); time.sleep(60)" \
    >/tmp/holder.out 2>&1 & holder=$!
  for i in $(seq 100); do grep -q 'holder ready' /tmp/holder.out && break; sleep 0.2; done
  cat >/tmp/job-nvml.cfg <<CFG
[job]
name = nvml-view
device = cuda:0
[model]
type = gpt
layers = 2
heads = 4
width = 128
context = 128
[data]
format = text
train = $top/.device/data/fortunes
[train]
steps = 100000
batch = 16
micro_batch = 16
threads = 8
eval_every = 0
[output]
dir = /tmp/out-nvml
checkpoint_every = 0
log_every = 1000
CFG
  id=$(ctl submit /tmp/job-nvml.cfg | grep -o '[0-9]\+' | head -1)
  for i in $(seq 100); do ctl --json status "$id" | grep -q '"state":"running"' && break; sleep 0.2; done
  sleep 2
  ctl status
  ctl top --once
  ctl --json status >/tmp/nvml-status.json
  "$py" - "$holder" "$id" "$(id -un)" <<'PY'
import json, sys
holder, job, user = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
st = json.load(open("/tmp/nvml-status.json"))
dev = [d for d in st["devices"] if d["id"] == "cuda0"][0]
procs = {p["pid"]: p for p in dev["processes"]}
ok = True
def check(what, cond):
    global ok
    ok &= bool(cond)
    print("nvml:", "PASS" if cond else "FAIL", what)
check("no process note (got %r)" % dev["process_note"], dev["process_note"] == "")
g = procs.get(st["pid"])
check("gradd listed with job %d: %r" % (job, g), g and g["command"] == "gradd" and job in g["jobs"])
h = procs.get(holder)
check("holder %d listed as %s, python, >= 4 GiB: %r" % (holder, user, h),
      h and h["user"] == user and h["command"].startswith("python") and h["used_bytes"] >= 1 << 32 and not h["jobs"])
print("nvml:", "ALL PASS" if ok else "SOME FAILED")
sys.exit(0 if ok else 1)
PY
  echo "rc=$?"
  ctl cancel "$id"
  kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
  gpid=$("$py" -c 'import json; print(json.load(open("/tmp/nvml-status.json"))["pid"])')
  kill -TERM "$gpid" 2>/dev/null; sleep 1
  echo "--- gradd log"; tail -10 /tmp/gradd-nvml.log
fi

section end
