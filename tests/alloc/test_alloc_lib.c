/* test_alloc_lib.c — libgradd-alloc on the simulated device.
 *
 * Against alloc_standin (a process standing in for PyTorch, driven one
 * command at a time): the shared page shows exactly what it allocated
 * across two threads on two streams, and what it holds; an idle process
 * answers a trim request; a fork child is refused; the budget refuses
 * with a message naming it, and the daemon can raise it through the page;
 * a device OOM asks for reclaim, waits a bounded time, retries once.
 * In this process: bad environments, bad arguments, and the statistics
 * the shim serves to torch.cuda's memory functions.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gradd_alloc.h"
#include "pool/pool_shm.h"

#define MiB ((uint64_t)1 << 20)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void nap_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* ==== the stand-in ===================================================================== */

typedef struct {
    pid_t pid;
    FILE *in, *out;
    int fd;
    pool_shm_page *pg;
    char reply[1024];
} standin;

/* Start the stand-in with a fresh page and "NAME=VALUE" settings. */
static void start(standin *s, const char *const *env)
{
    s->fd = pool_shm_create();
    assert_true(s->fd >= 0);
    char err[256];
    s->pg = pool_shm_map(s->fd, err, sizeof err);
    assert_non_null(s->pg);
    int to[2], from[2];
    /* Close-on-exec, or each stand-in would hold the others' pipes open. */
    assert_int_equal(pipe2(to, O_CLOEXEC), 0);
    assert_int_equal(pipe2(from, O_CLOEXEC), 0);
    s->pid = fork();
    assert_true(s->pid >= 0);
    if (s->pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        fcntl(s->fd, F_SETFD, 0);
        char fdv[16];
        snprintf(fdv, sizeof fdv, "%d", s->fd);
        setenv("GRADD_POOL_FD", fdv, 1);
        setenv("GRADD_ALLOC_BACKEND", "cpu", 1);
        for (; *env; env++)
            putenv((char *)*env);
        const char *exe = getenv("ALLOC_STANDIN");
        execl(exe, exe, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    s->in = fdopen(to[1], "w");
    s->out = fdopen(from[0], "r");
    setvbuf(s->in, NULL, _IOLBF, 0);
}

static const char *cmd(standin *s, const char *c)
{
    fprintf(s->in, "%s\n", c);
    fflush(s->in);
    if (!fgets(s->reply, sizeof s->reply, s->out))
        fail_msg("the stand-in died during \"%s\"", c);
    s->reply[strcspn(s->reply, "\n")] = 0;
    return s->reply;
}

static void stop(standin *s)
{
    fprintf(s->in, "quit\n");
    fclose(s->in);
    fclose(s->out);
    int st;
    assert_int_equal(waitpid(s->pid, &st, 0), s->pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    pool_shm_unmap(s->pg);
    close(s->fd);
}

/* The page's statistics once ok(stats) holds; fails after 5 s. */
static pool_stats wait_page(standin *s, bool (*ok)(const pool_stats *, uint64_t), uint64_t arg)
{
    pool_stats st;
    uint64_t end = now_ns() + 5000000000u;
    for (;;) {
        assert_int_equal(pool_shm_read(s->pg, &st, 100000000), 0);
        if (ok(&st, arg))
            return st;
        if (now_ns() > end)
            fail_msg("the page never showed what was expected (arg %llu)", (unsigned long long)arg);
        nap_ms(1);
    }
}

static bool allocs_total_is(const pool_stats *s, uint64_t n) { return s->allocations[POOL_ALL].allocated == n; }
static bool allocs_now_is(const pool_stats *s, uint64_t n) { return s->allocations[POOL_ALL].current == (int64_t)n; }
static bool ooms_is(const pool_stats *s, uint64_t n) { return s->ooms == n; }

static void test_standin_page(void **state)
{
    (void)state;
    const char *env[] = {"GRADD_ALLOC_CPU_CAPACITY=512M", "GRADD_JOB_ID=7", NULL};
    standin s;
    start(&s, env);

    unsigned long long n, bytes, req;
    const char *r = cmd(&s, "threads");
    if (sscanf(r, "ok allocs=%llu bytes=%llu requested=%llu", &n, &bytes, &req) != 3)
        fail_msg("threads: %s", r);
    assert_int_equal(n, 3 + 2 * 2000);
    pool_stats st = wait_page(&s, allocs_total_is, n);
    assert_int_equal(atomic_load(&s.pg->pid), s.pid);
    assert_int_equal(st.allocations[POOL_ALL].current, 0);
    /* Large blocks keep remainders of up to 1 MiB unsplit, so the pool's
     * bytes may pass the sum of rounded requests; what was asked for is
     * exact. */
    assert_true(st.allocated_bytes[POOL_ALL].allocated >= bytes);
    assert_int_equal(st.allocated_bytes[POOL_ALL].freed, st.allocated_bytes[POOL_ALL].allocated);
    assert_int_equal(st.requested_bytes[POOL_ALL].allocated, req);
    assert_int_equal(st.requested_bytes[POOL_ALL].freed, req);
    assert_int_equal(st.allocated_bytes[POOL_ALL].current, 0);
    assert_int_equal(st.ooms, 0);
    assert_int_equal(st.invalid_frees, 0);
    assert_int_equal(st.cache_hits + st.device_allocs >= n, true);
    assert_true(st.reserved_bytes[POOL_ALL].current > 0);
    assert_int_equal(st.cap, 512 * MiB);

    /* What it holds, by pool. */
    for (int i = 0; i < 4; i++)
        assert_string_equal(cmd(&s, "hold 1000"), "ok");
    assert_string_equal(cmd(&s, "hold 5242880"), "ok");
    st = wait_page(&s, allocs_now_is, 5);
    assert_int_equal(st.allocated_bytes[POOL_SMALL].current, 4 * 1024);
    assert_int_equal(st.allocated_bytes[POOL_LARGE].current, 5 * MiB);
    assert_int_equal(st.allocated_bytes[POOL_ALL].current, 4 * 1024 + 5 * MiB);
    assert_int_equal(st.requested_bytes[POOL_ALL].current, 4000 + 5 * MiB);
    assert_int_equal(st.allocations[POOL_SMALL].current, 4);

    /* Fork: the child is refused and the parent carries on. */
    assert_string_equal(cmd(&s, "fork"), "ok");

    /* Trim while the process sits idle: everything cached goes back. */
    assert_string_equal(cmd(&s, "freeall"), "ok");
    st = wait_page(&s, allocs_now_is, 0);
    int64_t cached = st.reserved_bytes[POOL_ALL].current;
    assert_true(cached > 0);
    uint64_t trims = st.trims;
    uint64_t req_no = pool_shm_request_trim(s.pg, 0, POOL_TRIM_REQUEST);
    uint64_t end = now_ns() + 5000000000u;
    while (!pool_shm_trim_done(s.pg, req_no) && now_ns() < end)
        nap_ms(1);
    assert_true(pool_shm_trim_done(s.pg, req_no));
    assert_int_equal(pool_shm_read(s.pg, &st, 100000000), 0);
    assert_int_equal(st.reserved_bytes[POOL_ALL].current, 0);
    assert_int_equal(st.trims, trims + 1);
    assert_int_equal(st.trimmed_bytes, (uint64_t)cached);
    stop(&s);
}

static void test_standin_budget(void **state)
{
    (void)state;
    const char *env[] = {"GRADD_ALLOC_CPU_CAPACITY=512M", "GRADD_ALLOC_LIMIT=64M", NULL};
    standin s;
    start(&s, env);
    assert_string_equal(cmd(&s, "hold 52428800"), "ok");
    const char *r = cmd(&s, "hold 20971520");
    const char *want = "oom CUDA out of memory. Tried to allocate 20.0M on device 0, over the job's "
                       "budget ([memory] limit) of 64.0M: it holds 50.0M.";
    if (strncmp(r, want, strlen(want)) != 0)
        fail_msg("got: %s", r);
    pool_stats st = wait_page(&s, ooms_is, 1);
    assert_int_equal(st.allocated_bytes[POOL_ALL].current, 50 * MiB);

    /* The daemon raises the budget through the page. */
    pool_shm_set_budget(s.pg, 128 * MiB);
    uint64_t end = now_ns() + 5000000000u;
    while (strcmp(cmd(&s, "hold 20971520"), "ok") != 0) {
        if (now_ns() > end)
            fail_msg("the raised budget was never applied: %s", s.reply);
        nap_ms(20);
    }
    st = wait_page(&s, allocs_now_is, 2);
    assert_int_equal(st.allocated_bytes[POOL_ALL].current, 70 * MiB);
    stop(&s);
}

static void test_standin_reclaim(void **state)
{
    (void)state;
    /* Another process holds 100M of the 256M device: 200M fits the
     * pool's cap but not the device, which is what reclaim is for. */
    const char *env[] = {"GRADD_ALLOC_CPU_CAPACITY=256M", "GRADD_ALLOC_CPU_EXTERNAL=100M",
                         "GRADD_RECLAIM_MS=300", NULL};
    standin s;
    start(&s, env);

    /* Nobody answers: the allocation fails after the bounded wait. */
    uint64_t t0 = now_ns();
    const char *r = cmd(&s, "hold 209715200");
    uint64_t took = now_ns() - t0;
    assert_int_equal(strncmp(r, "oom CUDA out of memory. Tried to allocate 200M on device 0.", 59), 0);
    assert_non_null(strstr(r, "device refused"));
    assert_true(took >= 300000000u && took < 5000000000u);
    assert_int_equal(atomic_load(&s.pg->need_seq), 1);
    assert_int_equal(atomic_load(&s.pg->need_bytes), 200 * MiB);
    /* Tried twice, before the request and once after, and counted once:
     * an OOM is what the program sees. */
    wait_page(&s, ooms_is, 1);

    /* The daemon answers: the allocation retries at once. */
    pool_shm_reclaim_answer(s.pg, 1);
    fprintf(s.in, "hold 209715200\n");
    fflush(s.in);
    uint64_t seq = 0, bytes = 0;
    uint64_t end = now_ns() + 5000000000u;
    while (!(seq = pool_shm_reclaim_pending(s.pg, &bytes)) && now_ns() < end)
        nap_ms(1);
    assert_int_equal(seq, 2);
    assert_int_equal(bytes, 200 * MiB);
    t0 = now_ns();
    pool_shm_reclaim_answer(s.pg, seq);
    assert_non_null(fgets(s.reply, sizeof s.reply, s.out));
    took = now_ns() - t0;
    assert_int_equal(strncmp(s.reply, "oom CUDA out of memory.", 23), 0);
    assert_true(took < 250000000u);
    wait_page(&s, ooms_is, 2);

    /* Past the pool's own cap nothing another job frees can help: no
     * request, no wait. */
    r = cmd(&s, "hold 314572800");
    assert_int_equal(strncmp(r, "oom CUDA out of memory.", 23), 0);
    assert_int_equal(atomic_load(&s.pg->need_seq), 2);
    stop(&s);
}

static bool reserved_at_most(const pool_stats *s, uint64_t n)
{
    return s->reserved_bytes[POOL_ALL].current <= (int64_t)n && s->trims > 0;
}

/* The daemon's [pool] policies reach a program's pool through the
 * environment, and what gradd's other processes hold of a simulated
 * device through the page. */
static void test_standin_policies(void **state)
{
    (void)state;
    const char *env[] = {"GRADD_ALLOC_CPU_CAPACITY=64M", "GRADD_ALLOC_GC_THRESHOLD=0.5", "GRADD_RECLAIM_MS=0",
                         NULL};
    standin s;
    start(&s, env);
    /* 48M cached is past half the cap: the helper's tick trims the least
     * recently used segments until the pool is under 32M. */
    for (int i = 0; i < 3; i++)
        assert_string_equal(cmd(&s, "hold 16777216"), "ok");
    assert_string_equal(cmd(&s, "freeall"), "ok");
    pool_stats st = wait_page(&s, reserved_at_most, 32 * MiB);
    assert_true(st.reserved_bytes[POOL_ALL].current > 0); /* gc keeps what fits under the threshold */
    assert_int_equal(st.idle_trims, 0);

    /* Others hold 40M of the 64M device: 32M does not fit, 16M does. */
    pool_shm_set_shared(s.pg, 40 * MiB);
    assert_string_equal(cmd(&s, "freeall"), "ok");
    uint64_t req_no = pool_shm_request_trim(s.pg, 0, POOL_TRIM_REQUEST);
    uint64_t end = now_ns() + 5000000000u;
    while (!pool_shm_trim_done(s.pg, req_no) && now_ns() < end)
        nap_ms(1);
    const char *r = cmd(&s, "hold 33554432");
    assert_int_equal(strncmp(r, "oom CUDA out of memory. Tried to allocate 32.0M on device 0.", 60), 0);
    assert_string_equal(cmd(&s, "hold 16777216"), "ok");
    /* They give it back: now it fits. */
    pool_shm_set_shared(s.pg, 0);
    assert_string_equal(cmd(&s, "hold 33554432"), "ok");
    stop(&s);
}

/* [pool] low_watermark in a program's pool: cached memory stays while the
 * device has room, and goes back when another process grows past the
 * watermark. */
static void test_standin_low_watermark(void **state)
{
    (void)state;
    const char *env[] = {"GRADD_ALLOC_CPU_CAPACITY=64M", "GRADD_ALLOC_LOW_WATERMARK=24M", "GRADD_RECLAIM_MS=0",
                         NULL};
    standin s;
    start(&s, env);
    assert_string_equal(cmd(&s, "hold 33554432"), "ok");
    assert_string_equal(cmd(&s, "freeall"), "ok");
    /* 32M free of 64M is above the watermark: three policy rounds (every
     * 50 ticks of 2 ms) leave the cache alone. */
    nap_ms(350);
    pool_stats st;
    assert_int_equal(pool_shm_read(s.pg, &st, 100000000), 0);
    assert_int_equal(st.reserved_bytes[POOL_ALL].current, 32 * MiB);
    assert_int_equal(st.trims, 0);
    /* Another process takes 16M: 16M free is under 24M, and the cache
     * goes back. */
    pool_shm_set_shared(s.pg, 16 * MiB);
    st = wait_page(&s, reserved_at_most, 0);
    assert_int_equal(st.trims, 1);
    assert_int_equal(st.trimmed_bytes, 32 * MiB);
    assert_int_equal(st.idle_trims, 0);
    stop(&s);
}

/* ==== in this process ==================================================================== */

static void env_case(const char *name, const char *value, const char *want)
{
    gradd_alloc_shutdown();
    setenv(name, value, 1);
    assert_int_equal(gradd_alloc_init(), -1);
    if (!strstr(gradd_alloc_last_error(), want))
        fail_msg("%s=%s: expected \"%s\" in \"%s\"", name, value, want, gradd_alloc_last_error());
    /* Every allocation then fails with the same reason. */
    assert_null(gradd_alloc(4096, 0, NULL));
    assert_non_null(strstr(gradd_alloc_last_error(), want));
    unsetenv(name);
    gradd_alloc_shutdown();
}

static void test_bad_environment(void **state)
{
    (void)state;
    setenv("GRADD_ALLOC_BACKEND", "cpu", 1);
    env_case("GRADD_ALLOC_LIMIT", "lots", "GRADD_ALLOC_LIMIT=lots: ");
    env_case("GRADD_ALLOC_CPU_CAPACITY", "0", "GRADD_ALLOC_CPU_CAPACITY must be above 0");
    env_case("GRADD_JOB_ID", "-3", "GRADD_JOB_ID=-3: not a whole number from 0 to 4294967295");
    env_case("GRADD_RECLAIM_MS", "20000", "GRADD_RECLAIM_MS=20000: not a whole number from 0 to 10000");
    env_case("GRADD_POOL_FD", "999", "GRADD_POOL_FD: pool page fd 999: Bad file descriptor");
    env_case("GRADD_POOL_FD", "0", "GRADD_POOL_FD: pool page fd 0: not a memfd");
    env_case("GRADD_ALLOC_BACKEND", "rocm", "GRADD_ALLOC_BACKEND=rocm: expected cuda or cpu");
    env_case("GRADD_ALLOC_GC_THRESHOLD", "1.5", "GRADD_ALLOC_GC_THRESHOLD=1.5: not a number from 0 to 1");
    env_case("GRADD_ALLOC_GC_THRESHOLD", "half", "GRADD_ALLOC_GC_THRESHOLD=half: not a number from 0 to 1");
    env_case("GRADD_ALLOC_LOW_WATERMARK", "-1", "GRADD_ALLOC_LOW_WATERMARK=-1: ");
    env_case("GRADD_ALLOC_TRIM_EVERY_MS", "soon", "GRADD_ALLOC_TRIM_EVERY_MS=soon: not a whole number");
#if !GRADD_ALLOC_HAVE_CUDA
    env_case("GRADD_ALLOC_BACKEND", "cuda", "GRADD_ALLOC_BACKEND=cuda: this library was built without CUDA");
#endif
}

static uint64_t json_num(const char *json, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p)
        fail_msg("no %s in %s", key, json);
    return strtoull(p + strlen(pat), NULL, 10);
}

static void test_in_process(void **state)
{
    (void)state;
    gradd_alloc_shutdown();
    setenv("GRADD_ALLOC_BACKEND", "cpu", 1);
    setenv("GRADD_ALLOC_CPU_CAPACITY", "256M", 1);
    assert_int_equal(gradd_alloc_init(), 0);

    /* Arguments. */
    assert_null(gradd_alloc(0, 0, NULL));
    assert_string_equal(gradd_alloc_last_error(), "");
    assert_null(gradd_alloc(-5, 0, NULL));
    assert_string_equal(gradd_alloc_last_error(), "gradd allocator: negative size -5");
    assert_null(gradd_alloc(512, 16, NULL));
    assert_string_equal(gradd_alloc_last_error(), "gradd allocator: device 16 is outside 0..15");
    gradd_free(NULL, 0, 0, NULL);
    assert_int_equal(gradd_memory_allocated(0), 0);

    /* The figures torch.cuda's functions get. */
    void *a = gradd_alloc(3 * MiB, 0, NULL);
    void *b = gradd_alloc(1000, 0, NULL);
    assert_non_null(a);
    assert_non_null(b);
    int x;
    gradd_free(&x, 4, 0, NULL); /* not the pool's: counted, ignored */
    gradd_free(b, 1000, 0, NULL);
    assert_int_equal(gradd_memory_allocated(0), 3 * MiB);
    assert_int_equal(gradd_max_memory_allocated(0), 3 * MiB + 1024);
    assert_int_equal(gradd_memory_reserved(0), 20 * MiB + 2 * MiB);
    assert_int_equal(gradd_max_memory_reserved(0), 22 * MiB);
    gradd_reset_peak_memory_stats(0);
    assert_int_equal(gradd_max_memory_allocated(0), 3 * MiB);

    char small[16];
    size_t need = gradd_memory_stats_json(0, small, sizeof small);
    assert_true(need > sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
    char *json = malloc(need + 1);
    assert_int_equal(gradd_memory_stats_json(0, json, need + 1), need);
    assert_int_equal(json[0], '{');
    assert_int_equal(json[need - 1], '}');
    assert_int_equal(json_num(json, "allocated_bytes.all.current"), 3 * MiB);
    assert_int_equal(json_num(json, "allocated_bytes.small_pool.peak"), 0); /* reset above */
    assert_int_equal(json_num(json, "allocated_bytes.small_pool.allocated"), 1024);
    assert_int_equal(json_num(json, "allocated_bytes.large_pool.allocated"), 3 * MiB);
    assert_int_equal(json_num(json, "reserved_bytes.all.current"), 22 * MiB);
    assert_int_equal(json_num(json, "allocation.all.allocated"), 2);
    assert_int_equal(json_num(json, "allocation.all.freed"), 1);
    assert_int_equal(json_num(json, "segment.all.current"), 2);
    assert_int_equal(json_num(json, "active_bytes.all.current"), 3 * MiB);
    assert_int_equal(json_num(json, "requested_bytes.all.allocated"), 3 * MiB + 1000);
    assert_int_equal(json_num(json, "num_device_alloc"), 2);
    assert_int_equal(json_num(json, "num_ooms"), 0);
    assert_int_equal(json_num(json, "num_alloc_retries"), 0);
    assert_int_equal(json_num(json, "gradd.invalid_frees"), 1);
    assert_non_null(strstr(json, "\"max_split_size\":-1,"));
    free(json);

    /* empty_cache gives back all that is cached. */
    gradd_empty_cache();
    assert_int_equal(gradd_memory_reserved(0), 20 * MiB);
    gradd_free(a, 3 * MiB, 0, NULL);
    gradd_empty_cache();
    assert_int_equal(gradd_memory_reserved(0), 0);
    assert_int_equal(gradd_memory_allocated(1), 0);
    gradd_alloc_shutdown();
    unsetenv("GRADD_ALLOC_CPU_CAPACITY");
}

int main(void)
{
    if (!getenv("ALLOC_STANDIN")) {
        fprintf(stderr, "ALLOC_STANDIN must name the stand-in program\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_standin_page),
        cmocka_unit_test(test_standin_budget),
        cmocka_unit_test(test_standin_reclaim),
        cmocka_unit_test(test_standin_policies),
        cmocka_unit_test(test_standin_low_watermark),
        cmocka_unit_test(test_bad_environment),
        cmocka_unit_test(test_in_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
