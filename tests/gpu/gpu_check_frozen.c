/* gpu_check_frozen.c — the CUDA ops a frozen base (LoRA, lora.h) runs on,
 * against the CPU's (see test_gpu_kernels.c): the embedding from a 16-bit
 * token table, exact (one exact widening and one add on both sides). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"
#include "gpu_check.h"

/* encoder_forward16w in a bf16/fp16 context, out starting random (it must
 * be overwritten).  table_off (16-bit elements) moves the table off its
 * 8-byte alignment: the scalar path. */
void test_encoder16w(int B, int T, int C, int V, bool with_wpe, int table_off)
{
    char name[64];
    snprintf(name, sizeof name, "encoder16w C=%d%s%s", C, with_wpe ? "" : " nowpe", table_off ? " unal" : "");
    if (!have16(name, "encoder_forward16w", H->encoder_forward16w != NULL, G->encoder_forward16w != NULL))
        return;
    size_t o = (size_t)table_off;
    buf16 wte = mk16((size_t)V * C + o, 4);
    buf wpe = mk((size_t)T * C, 1), out = mk((size_t)B * T * C, 1);
    ibuf inp = mki((size_t)B * T, 0, V);
    H->encoder_forward16w(hk, out.h, inp.h, wte.h + o, with_wpe ? wpe.h : NULL, B, T, C);
    G->encoder_forward16w(gk, out.d, inp.d, wte.d + o, with_wpe ? wpe.d : NULL, B, T, C);
    gsync(name);
    cmp(name, "out", &out, 0, 0);
    b16free(&wte), bfree(&wpe), bfree(&out), ibfree(&inp);
}
