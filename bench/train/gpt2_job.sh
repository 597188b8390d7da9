# bench/train/gpt2_job.sh — sourced, not run: `gpt2_job NAME TOKENS` prints the
# [job], [model] and [data] sections of a gradd job that trains GPT-2 124M
# (L=12 H=12 C=768 T=1024 V=50304) on cuda:0 from the llm.c token file
# TOKENS; the caller appends [train] and what else its run needs.
# bench/train/run_gpu.sh (the benchmark) and scripts/gpu-session.sh (adaptive
# batching on the GPU) both train this model; one definition keeps them
# training the same network.
gpt2_job() {
  cat <<CFG
[job]
name = $1
device = cuda:0
[model]
type = gpt
layers = 12
heads = 12
width = 768
context = 1024
vocab = 50304
[data]
format = tokens
train = $2
val_fraction = 0
CFG
}
