/* test_gpu_kernels.c — every CUDA kernel against its CPU reference.
 *
 * Exit 0: passed.  Exit 77: no usable GPU here (meson reports "skipped").
 * Anything else: failed, with the reason on stderr.  Takes the path of
 * gradd-cuda.so (or its directory) as its argument: the CUDA ops table is
 * the one that module exports (dlsym KERN_CUDA_OPS_SYMBOL), the CPU one is
 * kern_cpu_ops().  For every op: the same random inputs on both, both run,
 * the results compared element by element, |gpu − cpu| ≤ rtol·|cpu| +
 * atol·max|cpu|, with the maximum errors printed.  Gradient buffers start
 * random (not zero), so the "+=" of every backward that accumulates is
 * checked too, and that the ones that overwrite (matmul's dinp, gelu, relu,
 * crossentropy) do overwrite.
 *
 * Tolerances: fp32 context: 1e-5 (pointwise) to 1e-4 (GEMMs, reductions);
 * bf16/fp16 contexts (GEMM inputs in 16 bits, fp32 accumulate): 2e-2 of
 * the largest value; casts and counts: exact.
 *
 * The 16-bit activation ops (layernorm_forward16, gelu_forward16,
 * gelu_backward16, Llama's RMSNorm and SwiGLU) round an fp32 result once, and the two backends' fp32
 * results may differ in the last fp32 bits, which can carry a value across
 * a 16-bit rounding boundary: their outputs are compared widened to fp32,
 * |gpu − cpu| ≤ ulp16(cpu) + the fp32 op's tolerance, with the count of
 * bitwise matches printed.  On the GPU alone they must be bitwise the fp32
 * op followed by the GPU's cast, as kernels.h defines them.
 * matmul_forward16/backward16 get the same 16-bit operands on both sides
 * and the bf16/fp16 GEMM tolerance; dbias is an fp32 sum on both: 1e-4.
 *
 * This file loads the tables and runs the checks in order, per precision;
 * the checks are in gpu_check_layers.c, gpu_check_optim.c,
 * gpu_check_act16.c, gpu_check_llama.c and gpu_check_frozen.c, on the
 * buffers and comparisons of gpu_check.c.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <libgen.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool/dev.h"
#include "kernels.h"
#include "gpu_check.h"

/* ---- scratch through a callback, as the pool provides it ----------------------------------- */

typedef struct {
    int live, acquired;
    size_t peak_bytes;
} scratch_stats;

static void *scratch_acquire(void *user, size_t bytes)
{
    scratch_stats *s = user;
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess)
        return NULL;
    s->live++;
    s->acquired++;
    if (bytes > s->peak_bytes)
        s->peak_bytes = bytes;
    return p;
}

static void scratch_release(void *user, void *p)
{
    scratch_stats *s = user;
    s->live--;
    cudaFree(p);
}

/* ---- main ---------------------------------------------------------------------------------- */

static void run_fp32(void)
{
    printf("fp32 context\n");
    test_memory();
    test_encoder(4, 32, 96, 17);
    test_encoder(3, 17, 30, 5);
    test_layernorm(257, 96);
    test_layernorm(100, 63);
    test_layernorm(64, 768);
    test_layernorm(4096, 768); /* GPT-2 124M's width: the register kernels, 256 blocks of 16 rows */
    test_matmul("fp32", 256, 96, 288, true, true, 0, 1e-4, 1e-5);
    test_matmul("fp32", 33, 17, 29, true, true, 0, 1e-4, 1e-5);
    test_matmul("fp32", 64, 32, 48, false, false, 0, 1e-4, 1e-5);
    test_matmul("fp32", 48, 40, 24, true, true, 1, 1e-4, 1e-5);
    test_matmul("fp32", 512, 768, 2304, true, true, 0, 1e-4, 1e-5);
    test_attention("fp32", 2, 64, 96, 4, 1e-4, 1e-5);
    test_attention("fp32", 3, 37, 48, 3, 1e-4, 1e-5);
    test_attention("fp32", 1, 256, 768, 12, 1e-4, 1e-5);
    test_pointwise(10007, 0);
    test_pointwise(4099, 1);
    test_crossentropy(64, 1000, 1024);
    test_crossentropy(33, 37, 37);
    test_crossentropy(8, 50257, 50304);
    test_sumsq(1000003, 0);
    test_sumsq(12345, 1);
    test_adamw(10007);
    test_adamw_multi(0, false);
    test_adamw_multi(1, false);
    test_casts(100003);
    test_nonfinite(1000003, 0);
    test_nonfinite(5003, 1);
    test_determinism();
    /* Llama: Llama 3.2 1B's heads (32 of 64, 8 KV heads) and Llama 3 8B's
     * head size, T not a multiple of any block. */
    test_encoder_nowpe(2, 33, 96, 17);
    test_rmsnorm(257, 2048);
    test_rmsnorm(33, 63);
    test_rope(2, 300, 32, 8, 64, false);
    test_rope(1, 301, 4, 2, 128, true);
    test_swiglu(129, 8192);
    test_gqa(2, 257, 32, 8, 64, false, 1e-4, 1e-5);
    test_gqa(2, 257, 32, 8, 64, true, 1e-4, 1e-5);
    test_gqa(1, 1000, 8, 2, 128, true, 1e-4, 1e-5);
    test_gqa(1, 129, 4, 4, 128, false, 1e-4, 1e-5);
    /* A frozen base's norms: the register and the general layernorm
     * backward, Llama 3.2 1B's width. */
    test_frozen_norms(4096, 768);
    test_frozen_norms(100, 63);
    test_frozen_norms(257, 2048);
    /* A frozen fp32 base's GEMMs. */
    test_frozen_mm(256, 96, 288, 1e-4, 1e-5);
    test_frozen_mm(33, 17, 29, 1e-4, 1e-5);
}

static void run_lowp(const char *prec)
{
    ctx_bf16 = !strcmp(prec, "bf16");
    /* The cpu's 16-bit ops read and write the type their context's
     * precision names (an fp32 context: bf16), so the reference side gets a
     * context of the same precision for this pass. */
    kern_ctx *h32 = hk;
    hk = H->ctx_create(0, 0, ctx_bf16 ? KERN_BF16 : KERN_FP16, NULL);
    if (!hk) {
        FAIL("cpu %s ctx_create failed", prec);
        hk = h32;
        return;
    }
    printf("%s context (GEMM inputs in 16 bits)\n", prec);
    test_matmul(prec, 256, 96, 288, true, true, 0, 2e-2, 2e-2);
    test_matmul(prec, 33, 17, 29, true, true, 0, 2e-2, 2e-2);
    test_matmul(prec, 48, 40, 24, false, true, 1, 2e-2, 2e-2);
    test_matmul(prec, 512, 768, 3072, true, true, 0, 2e-2, 2e-2);
    test_attention(prec, 2, 64, 96, 4, 2e-2, 2e-2);
    test_attention(prec, 1, 128, 768, 12, 2e-2, 2e-2);
    /* Tails (T not a multiple of the 64-row blocks), several blocks, GPT-2's heads. */
    test_attention_fused(prec, 2, 133, 128, 2, 2e-2, 2e-2);
    test_attention_fused(prec, 1, 64, 64, 1, 2e-2, 2e-2);
    test_attention_fused(prec, 2, 512, 768, 12, 2e-2, 2e-2);
    /* T between two and four 64-row blocks, not a multiple of 64. */
    test_attention_fused(prec, 1, 200, 128, 2, 2e-2, 2e-2);
    /* The same on a 16-bit qkv, as the model's 16-bit path runs it. */
    test_attention_fused16(prec, 2, 133, 128, 2, 2e-2, 2e-2);
    test_attention_fused16(prec, 2, 512, 768, 12, 2e-2, 2e-2);
    /* Llama's attention in a 16-bit context: gqa.cu's fp32 kernels, with
     * GRADD_GQA=mma gqa_mma.cu's tensor-core ones, with GRADD_GQA=cudnn
     * cuDNN's for the unpacked shapes (the GPU session runs this program
     * each way). */
    test_gqa(2, 257, 32, 8, 64, false, 2e-2, 2e-2);
    test_gqa(2, 257, 32, 8, 64, true, 2e-2, 2e-2);
    test_gqa(1, 1000, 8, 2, 128, true, 2e-2, 2e-2);
    test_gqa(1, 129, 4, 4, 128, false, 2e-2, 2e-2);
    /* The 16-bit activation ops: Llama's at Llama 3.2 1B's width and MLP,
     * and odd shapes; */
    test_rmsnorm16(257, 2048);
    test_rmsnorm16(33, 63);
    test_swiglu16(129, 8192);
    test_swiglu16(7, 301);
    /* GPT's. */
    test_layernorm16(257, 96, 0);
    test_layernorm16(100, 63, 0);
    test_layernorm16(64, 768, 0);
    test_layernorm16(33, 96, 2);
    /* GPT-2 shapes: C = 768 on the register kernels (forward and the fused
     * backward, 256 blocks of 16 rows), unaligned (the general ones), and
     * C = 1024 (register forward, general backward). */
    test_layernorm16(4096, 768, 0);
    test_layernorm16(1000, 768, 2);
    test_layernorm16(300, 1024, 0);
    test_gelu16(10007, 0, 0);
    test_gelu16(4099, 1, 1);
    test_gelu16(4099, 0, 2);
    test_gelu16(4099, 0, 4);
    test_matmul16(256, 96, 288, true, true, 0);
    test_matmul16(33, 17, 29, true, true, 0);    /* N·C, C, OC odd */
    test_matmul16(48, 40, 24, false, false, 1);  /* pointers 2 or 4 bytes off */
    test_matmul16(45, 52, 2304, true, false, 0); /* N·C = 2340, not a multiple of 8 */
    test_matmul16(64, 128, 50304, false, true, 0); /* GPT-2's padded vocabulary (lm head) */
    test_matmul16(31, 52, 50304, true, true, 0);
    test_matmul16(512, 768, 3072, true, true, 0);
    test_out16_bias(512, 768, 3072, 0);   /* GPT-2's MLP hidden layer */
    test_out16_bias(33, 17, 29, 1);       /* odd, pointers 2 or 4 bytes off */
    test_gelu_gemm16(512, 768, 3072, 0);  /* GPT-2's MLP: the epilogue path */
    test_gelu_gemm16(33, 17, 29, 1);      /* Hd not a multiple of 8: the two ops */
    test_logits16(64, 128, 50257, 50304); /* GPT-2's vocabulary, padded */
    test_logits16(33, 52, 37, 37);        /* odd: the scalar paths */
    test_logits16(64, 128, 50304, 50304); /* V = Vp, as the daemon runs GPT-2 */
    test_logits16(16, 64, 1001, 1004);    /* Vp % 8 == 4: the fused fallback, 4-wide */
    test_determinism16();
    /* A frozen base held in 16 bits: its token table, aligned or not, and
     * its backward ops without weight gradients (layernorm's register and
     * general paths). */
    test_encoder16w(2, 33, 96, 17, true, 0);
    test_encoder16w(2, 33, 96, 17, false, 1);
    test_encoder16w(1, 9, 2050, 5, false, 0);
    test_frozen_norms16(4096, 768);
    test_frozen_norms16(100, 63);
    test_frozen_mm16(256, 96, 288);
    test_frozen_mm16(33, 17, 29);
    test_frozen_mm(256, 96, 288, 2e-2, 2e-2); /* an fp32 base's GEMMs on 16-bit inputs */
    test_adamw16(10007, 0);
    test_adamw16(4099, 1);
    test_adamw_multi(0, true);
    test_adamw_multi(1, true);
    H->ctx_destroy(hk);
    hk = h32;
}

int main(int argc, char **argv)
{
    char dir[4096] = "", path[4200] = "";
    setvbuf(stdout, NULL, _IOLBF, 0); /* in order with stderr's FAIL lines */
    if (argc > 1) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", argv[1]);
        if (strstr(tmp, ".so")) {
            snprintf(path, sizeof path, "%s", argv[1]);
            snprintf(dir, sizeof dir, "%s", dirname(tmp));
        } else {
            snprintf(dir, sizeof dir, "%s", argv[1]);
            snprintf(path, sizeof path, "%s/gradd-cuda.so", argv[1]);
        }
    }
    dev *devs[16];
    char why[256] = "";
    int n = dev_cuda_probe(dir[0] ? dir : NULL, devs, 16, why, sizeof why);
    if (n == 0) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    int ordinal = devs[0]->index;
    printf("%s: %s\n", devs[0]->id, devs[0]->name);
    for (int i = 0; i < n; i++)
        dev_destroy(devs[i]);
    if (!path[0]) {
        fprintf(stderr, "usage: %s path/to/gradd-cuda.so\n", argv[0]);
        return 2;
    }
    void *mod = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!mod) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    G = dlsym(mod, KERN_CUDA_OPS_SYMBOL);
    H = kern_cpu_ops();
    if (!G || !H) {
        fprintf(stderr, "no %s in %s\n", G ? "cpu table" : KERN_CUDA_OPS_SYMBOL, path);
        return 1;
    }
    /* Every entry of the table is filled, but attention_decode (sampling
     * decodes on the cpu) and act16_native (a bool, not a function). */
    const void *const *slots = (const void *const *)((const char *)G + sizeof(const char *));
    size_t nslots = (sizeof(kern_ops) - sizeof(const char *)) / sizeof(void *);
    for (size_t i = 0; i < nslots; i++) {
        size_t off = sizeof(const char *) + i * sizeof(void *);
        if (off == offsetof(kern_ops, attention_decode) || off == offsetof(kern_ops, act16_native))
            continue;
        if (!slots[i])
            FAIL("kern_ops slot %zu of the cuda table is NULL", i);
    }
    if (!G->act16_native)
        FAIL("the cuda table says its 16-bit ops are not native");
    if (strcmp(G->name, "cuda"))
        FAIL("table name '%s'", G->name);
    cudaSetDevice(ordinal);

    hk = H->ctx_create(0, 0, KERN_FP32, NULL);
    gk = G->ctx_create(0, ordinal, KERN_FP32, NULL);
    if (!hk || !gk) {
        fprintf(stderr, "ctx_create failed (cpu %p, cuda %p)\n", (void *)hk, (void *)gk);
        return 1;
    }
    run_fp32();
    G->ctx_destroy(gk);
    free_all();

    /* bf16 with scratch from a callback: after sync only the cuBLASLt
     * workspace and adamw_multi's chunk table (the last one made) are still
     * held. */
    scratch_stats ss = {0, 0, 0};
    kern_scratch cb = {scratch_acquire, scratch_release, &ss};
    gk = G->ctx_create(0, ordinal, KERN_BF16, &cb);
    if (!gk) {
        FAIL("bf16 ctx_create failed");
    } else {
        run_lowp("bf16");
        gsync("bf16");
        printf("  scratch callback: %d acquisitions, peak %zu KiB, %d live after sync\n", ss.acquired,
               ss.peak_bytes >> 10, ss.live);
        if (ss.acquired < 2 || ss.live != 2)
            FAIL("scratch callback: %d acquired, %d live after sync (want >= 2, 2)", ss.acquired, ss.live);
        G->ctx_destroy(gk);
        if (ss.live != 0)
            FAIL("scratch callback: %d buffers live after ctx_destroy", ss.live);
    }
    free_all();

    gk = G->ctx_create(0, ordinal, KERN_FP16, NULL);
    if (!gk) {
        FAIL("fp16 ctx_create failed");
    } else {
        run_lowp("fp16");
        G->ctx_destroy(gk);
    }
    free_all();
    H->ctx_destroy(hk);

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
