/* test_cudnn_sdpa.c — cuDNN's attention graphs (kernels/cuda/cudnn_sdpa.c).
 *
 * Without a GPU: libcudnn.so.9 loads and has every function the graphs
 * call (dlsym), so that a GPU session does not find a misnamed one; the
 * first call that needs a device, cudnnCreate, is where it must stop.
 * With one: cuDNN makes a plan for the forward and the backward at Llama
 * 3.2 1B's heads (head size 64, 4 query heads a key/value head) and Llama 3
 * 8B's head size (128), in bf16 and fp16.  Their numbers are checked
 * against the CPU reference by test_gpu_kernels with GRADD_GQA=cudnn.
 * Exits 77 where cuDNN cannot be loaded or the build has no cuDNN headers. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "cudnn_sdpa.h"

int main(void)
{
    char why[1024] = "";
    int ndev = 0;
    bool gpu = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
    sdpa_lib *lib = sdpa_open(NULL, why, sizeof why);
    if (!lib) {
        if (strstr(why, "without cuDNN") || strstr(why, "cannot be loaded")) {
            printf("skipped: %s\n", why);
            return 77;
        }
        if (!gpu && !strncmp(why, "cuDNN cudnnCreate:", 18)) {
            printf("ok: every function resolved; without a GPU: %s\n", why);
            return 0;
        }
        printf("FAIL: %s\n", why);
        return 1;
    }
    printf("cuDNN %zu\n", sdpa_version(lib));
    static const int shapes[][5] = {{2, 257, 32, 8, 64}, {1, 1000, 8, 2, 128}, {1, 129, 4, 4, 128}};
    int failed = 0;
    for (int bf = 0; bf < 2; bf++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int bwd = 0; bwd < 2; bwd++) {
                const int *d = shapes[s];
                sdpa_plan *p = sdpa_plan_make(lib, bwd, bf, d[0], d[1], d[2], d[3], d[4], why, sizeof why);
                printf("%s %s B=%d T=%d NH=%d KVH=%d HS=%d: %s", bf ? "bf16" : "fp16", bwd ? "backward" : "forward",
                       d[0], d[1], d[2], d[3], d[4], p ? "plan" : "FAIL ");
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
