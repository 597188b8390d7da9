/* test_cudnn_sdpa.c — cuDNN's attention graphs (kernels/cuda/cudnn_sdpa.c).
 *
 * Everywhere: libcudnn.so.9 loads and has every function the graphs call
 * (dlsym), and cuDNN finalizes every tensor and op of both graphs at each
 * shape below, in bf16 and fp16 (sdpa_check_ops: each matmul's, reduction's
 * and pointwise op's shapes and types are checked there, without a device).
 * Without a GPU the first call that needs one, cudnnCreate, is where it
 * must stop.  With one: cuDNN makes a plan for the forward and the backward at Llama
 * 3.2 1B's heads (head size 64, 4 query heads a key/value head) and Llama 3
 * 8B's head size (128), in bf16 and fp16.  Their numbers are checked
 * against the CPU reference by test_gpu_kernels with GRADD_GQA=cudnn.
 * Exits 77 where cuDNN cannot be loaded or the build has no cuDNN headers. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "cudnn_sdpa.h"

static const int shapes[][5] = {{2, 257, 32, 8, 64}, {1, 1000, 8, 2, 128}, {1, 129, 4, 4, 128}};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

/* The graphs' ops, finalized one by one: 14 forward; 24 backward with
 * grouped heads (dK and dV summed over each group), 22 without. */
static int check_ops(void)
{
    int failed = 0;
    char why[1024];
    for (int bf = 0; bf < 2; bf++)
        for (size_t s = 0; s < NSHAPES; s++)
            for (int bwd = 0; bwd < 2; bwd++) {
                const int *d = shapes[s];
                int want = !bwd ? 14 : d[2] != d[3] ? 24 : 22;
                int n = sdpa_check_ops(bwd, bf, d[0], d[1], d[2], d[3], d[4], why, sizeof why);
                printf("ops %s %s B=%d T=%d NH=%d KVH=%d HS=%d: %d%s%s\n", bf ? "bf16" : "fp16",
                       bwd ? "backward" : "forward", d[0], d[1], d[2], d[3], d[4], n, n < 0 ? " " : "",
                       n < 0 ? why : "");
                if (n != want) {
                    printf("FAIL: %d ops, expected %d\n", n, want);
                    failed++;
                }
            }
    return failed;
}

int main(void)
{
    char why[1024] = "";
    int ndev = 0;
    bool gpu = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
    if (sdpa_check_ops(false, true, 1, 8, 1, 1, 64, why, sizeof why) < 0 &&
        (strstr(why, "without cuDNN") || strstr(why, "cannot be loaded"))) {
        printf("skipped: %s\n", why);
        return 77;
    }
    int failed = check_ops();
    sdpa_lib *lib = sdpa_open(NULL, why, sizeof why);
    if (!lib) {
        if (!gpu && !strncmp(why, "cuDNN cudnnCreate:", 18)) {
            printf("without a GPU, as expected: %s\n", why);
            return failed ? 1 : 0;
        }
        printf("FAIL: %s\n", why);
        return 1;
    }
    printf("cuDNN %zu\n", sdpa_version(lib));
    for (int bf = 0; bf < 2; bf++)
        for (size_t s = 0; s < NSHAPES; s++)
            for (int bwd = 0; bwd < 2; bwd++) {
                const int *d = shapes[s];
                sdpa_plan *p = sdpa_plan_make(lib, bwd, bf, d[0], d[1], d[2], d[3], d[4], why, sizeof why);
                printf("plan %s %s B=%d T=%d NH=%d KVH=%d HS=%d: %s", bf ? "bf16" : "fp16",
                       bwd ? "backward" : "forward", d[0], d[1], d[2], d[3], d[4], p ? "made" : "FAIL ");
                if (p)
                    printf(", scratch %zu bytes\n", sdpa_plan_scratch(p));
                else
                    printf("%s\n", why);
                failed += !p;
                sdpa_plan_free(p);
            }
    sdpa_close(lib);
    return failed ? 1 : 0;
}
