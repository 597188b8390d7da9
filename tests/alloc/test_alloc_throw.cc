// test_alloc_throw.cc — the entry point PyTorch calls throws on failure:
// an over-budget and a device-sized request each arrive as a catchable
// std::exception whose message starts "CUDA out of memory." (and names
// the budget when that was the cause); success and a 0-byte request do
// not throw.  On the simulated device, with the C++ runtime PyTorch uses.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "gradd_alloc.h"

static int failures;

static void expect(bool ok, const char *what)
{
    if (!ok) {
        std::fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

static const char *throw_message(ssize_t size)
{
    static char msg[1024];
    msg[0] = 0;
    try {
        void *p = gradd_alloc_throwing(size, 0, nullptr);
        std::snprintf(msg, sizeof msg, "no exception (%p)", p);
    } catch (const std::exception &e) {
        std::snprintf(msg, sizeof msg, "%s", e.what());
    }
    return msg;
}

int main()
{
    setenv("GRADD_ALLOC_BACKEND", "cpu", 1);
    setenv("GRADD_ALLOC_CPU_CAPACITY", "64M", 1);
    setenv("GRADD_ALLOC_LIMIT", "16M", 1);
    unsetenv("GRADD_POOL_FD");

    void *p = gradd_alloc_throwing(8 << 20, 0, nullptr);
    expect(p != nullptr, "an allocation within the budget succeeds");
    expect(gradd_alloc_throwing(0, 0, nullptr) == nullptr, "0 bytes is NULL without an exception");

    const char *m = throw_message(12 << 20);
    std::printf("over budget: %s\n", m);
    const char *want = "CUDA out of memory. Tried to allocate 12.0M on device 0, over the job's "
                       "budget ([memory] limit) of 16.0M: it holds 8.00M.";
    expect(std::strncmp(m, want, std::strlen(want)) == 0,
           "the over-budget message");
    gradd_free(p, 8 << 20, 0, nullptr);

    gradd_alloc_shutdown();
    unsetenv("GRADD_ALLOC_LIMIT");
    m = throw_message((ssize_t)100 << 20);
    std::printf("over the device: %s\n", m);
    want = "CUDA out of memory. Tried to allocate 100M on device 0. (gradd: out of memory on cpu0";
    expect(std::strncmp(m, want, std::strlen(want)) == 0,
           "the device OOM message");
    expect(std::strstr(m, "budget") == nullptr, "a device OOM does not blame the budget");
    gradd_alloc_shutdown();
    return failures ? 1 : 0;
}
