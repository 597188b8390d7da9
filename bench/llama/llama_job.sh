# bench/llama/llama_job.sh — sourced, not run: `llama_job NAME DEVICE TOKENS`
# prints the [job], [model] and [data] sections of a gradd job that trains a
# Llama of the shape in L C NH KVH F V T (layers, width, heads, key/value
# heads, MLP width, vocabulary, context; rope_theta 500000, tied embeddings,
# random init) on DEVICE from the llm.c token file TOKENS; the caller
# appends [train] and what else its run needs.  bench/llama (full training
# against PyTorch) and bench/lora (LoRA against peft) train this model.
llama_job() {
  cat <<CFG
[job]
name = $1
device = $2
[model]
type = llama
layers = $L
heads = $NH
kv_heads = $KVH
width = $C
mlp_width = $F
context = $T
vocab = $V
rope_theta = 500000
norm_eps = 1e-5
tie_embeddings = on
[data]
format = tokens
train = $3
val_fraction = 0
CFG
}
