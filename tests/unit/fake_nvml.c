/* fake_nvml.c — a stand-in for libnvidia-ml, for test_dev_nvml: the five
 * functions gradd resolves, over a fixed table of processes on one device
 * at PCI bus id 0000:3b:00.0.  It answers "insufficient size" to a buffer
 * too small, as NVML does, so the caller's retry is exercised. */
#include <string.h>

typedef struct {
    unsigned int pid;
    unsigned long long used;
    unsigned int gi, ci;
} proc_info;

static const proc_info procs[] = {
    {100, 1ull << 30, 1, 2},
    {200, ~0ull, 3, 4}, /* NVML_VALUE_NOT_AVAILABLE */
};
#define NPROCS (sizeof procs / sizeof procs[0])

/* How many processes the fake claims (tests set it through fake_nvml_set). */
static unsigned int claimed = NPROCS;
static int inits;

__attribute__((visibility("default"))) void fake_nvml_set(unsigned int n)
{
    claimed = n;
}

__attribute__((visibility("default"))) int fake_nvml_inits(void)
{
    return inits;
}

__attribute__((visibility("default"))) int nvmlInit_v2(void)
{
    inits++;
    return 0;
}

__attribute__((visibility("default"))) int nvmlShutdown(void)
{
    inits--;
    return 0;
}

__attribute__((visibility("default"))) const char *nvmlErrorString(int r)
{
    return r == 6 ? "Not Found" : r == 7 ? "Insufficient Size" : "Unknown Error";
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev)
{
    if (strcmp(bus, "0000:3b:00.0") != 0)
        return 6;
    *dev = (void *)procs;
    return 0;
}

__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned int *count,
                                                                                   proc_info *out)
{
    (void)dev;
    if (*count < claimed) {
        *count = claimed;
        return 7;
    }
    for (unsigned int i = 0; i < claimed; i++)
        out[i] = procs[i % NPROCS];
    *count = claimed;
    return 0;
}
