/* alloc_standin.c — stands in for a PyTorch process on libgradd-alloc's
 * simulated device: it links the library as a program would and acts on
 * one command per stdin line, answering one line on stdout, so that a test
 * (test_alloc_lib.c) can read the shared page between steps.
 *
 *   streams        a block freed on one stream is not handed to another;
 *                  the same stream gets it back
 *   threads        two threads, each on its own stream, allocate, stamp,
 *                  check and free 2000 blocks; answers the totals:
 *                  "ok allocs=N bytes=B requested=R" (rounded and asked-for
 *                  bytes, the streams step included)
 *   hold SIZE      allocate SIZE bytes and keep them: "ok" or "oom MESSAGE"
 *   freeall        free what hold kept
 *   stats          "ok allocated=A reserved=R peak=P", the getters' figures
 *   fork           fork; the child must be refused cleanly: "ok" or "fail ..."
 *   quit
 *
 * alloc_standin [IN [OUT]]: commands from IN (a FIFO, for a program job,
 * whose stdin is /dev/null) rather than stdin, and answers also appended
 * to OUT.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gradd_alloc.h"

#define MAX_HELD 64

static void *held[MAX_HELD];
static ssize_t held_size[MAX_HELD];
static int nheld;
static uint64_t total_allocs, total_bytes, total_requested;
static pthread_mutex_t totals_lock = PTHREAD_MUTEX_INITIALIZER;

/* Answers go to stdout and, when the command line names one, to a file
 * the test reads (a program job's stdout is its log). */
static FILE *answers;

static void reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void reply(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (answers) {
        va_start(ap, fmt);
        vfprintf(answers, fmt, ap);
        va_end(ap);
        fflush(answers);
    }
}

static uint64_t round512(uint64_t n) { return (n + 511) / 512 * 512; }

static void count(uint64_t n)
{
    pthread_mutex_lock(&totals_lock);
    total_allocs++;
    total_bytes += round512(n);
    total_requested += n;
    pthread_mutex_unlock(&totals_lock);
}

static const char *streams(void)
{
    void *s1 = (void *)0x10, *s2 = (void *)0x20;
    void *a = gradd_alloc(1 << 20, 0, s1);
    if (!a)
        return gradd_alloc_last_error();
    count(1 << 20);
    gradd_free(a, 1 << 20, 0, s1);
    void *b = gradd_alloc(1 << 20, 0, s2);
    count(1 << 20);
    void *a2 = gradd_alloc(1 << 20, 0, s1);
    count(1 << 20);
    const char *r = !b || !a2 ? "allocation failed" : b == a ? "stream 2 got stream 1's freed block"
                    : a2 != a ? "stream 1 did not get its own block back" : NULL;
    gradd_free(b, 1 << 20, 0, s2);
    gradd_free(a2, 1 << 20, 0, s1);
    return r;
}

typedef struct {
    void *stream;
    uint64_t seed;
    const char *err;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    void *live[8] = {0};
    size_t sz[8] = {0};
    uint64_t x = w->seed;
    for (int i = 0; i < 2000 && !w->err; i++) {
        int k = i % 8;
        if (live[k]) {
            /* The stamp written at allocation must have survived the
             * other thread's blocks. */
            unsigned char *p = live[k];
            if (p[0] != (unsigned char)k || p[sz[k] - 1] != (unsigned char)(k ^ 0x5a))
                w->err = "a live block was overwritten";
            gradd_free(live[k], (ssize_t)sz[k], 0, w->stream);
        }
        x = x * 6364136223846793005u + 1442695040888963407u;
        sz[k] = 1 + (x >> 33) % (3u << 20);
        live[k] = gradd_alloc((ssize_t)sz[k], 0, w->stream);
        if (!live[k]) {
            w->err = "allocation failed";
            break;
        }
        count(sz[k]);
        unsigned char *p = live[k];
        p[0] = (unsigned char)k;
        p[sz[k] - 1] = (unsigned char)(k ^ 0x5a);
    }
    for (int k = 0; k < 8; k++)
        gradd_free(live[k], (ssize_t)sz[k], 0, w->stream);
    return NULL;
}

static void threads(void)
{
    const char *e = streams();
    worker w[2] = {{(void *)0x10, 1, NULL}, {(void *)0x20, 2, NULL}};
    pthread_t t[2];
    for (int i = 0; i < 2 && !e; i++)
        if (pthread_create(&t[i], NULL, work, &w[i]) != 0)
            e = "pthread_create failed";
    if (!e) {
        pthread_join(t[0], NULL);
        pthread_join(t[1], NULL);
        e = w[0].err ? w[0].err : w[1].err;
    }
    if (e)
        reply("fail %s\n", e);
    else
        reply("ok allocs=%llu bytes=%llu requested=%llu\n", (unsigned long long)total_allocs,
               (unsigned long long)total_bytes, (unsigned long long)total_requested);
}

static void do_fork(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        /* The child: refused, with the reason; the parent's blocks untouched. */
        void *p = gradd_alloc(4096, 0, NULL);
        int bad = p != NULL || !strstr(gradd_alloc_last_error(), "forked");
        if (nheld)
            gradd_free(held[0], held_size[0], 0, NULL);
        bad |= gradd_memory_allocated(0) != 0;
        _exit(bad);
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        reply("fail the child was not refused cleanly\n");
        return;
    }
    void *p = gradd_alloc(4096, 0, NULL);
    if (!p) {
        reply("fail the parent cannot allocate after fork: %s\n", gradd_alloc_last_error());
        return;
    }
    gradd_free(p, 4096, 0, NULL);
    reply("ok\n");
}

int main(int argc, char **argv)
{
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    FILE *in = stdin;
    /* A FIFO opened read-write never reaches its end when a writer
     * closes: the test writes one command at a time. */
    if (argc > 1 && !(in = fopen(argv[1], "r+"))) {
        perror(argv[1]);
        return 2;
    }
    if (argc > 2 && !(answers = fopen(argv[2], "a"))) {
        perror(argv[2]);
        return 2;
    }
    while (fgets(line, sizeof line, in)) {
        long long n;
        if (strcmp(line, "streams\n") == 0) {
            const char *e = streams();
            reply(e ? "fail %s\n" : "ok\n", e);
        } else if (strcmp(line, "threads\n") == 0) {
            threads();
        } else if (sscanf(line, "hold %lld", &n) == 1 && nheld < MAX_HELD) {
            void *p = gradd_alloc((ssize_t)n, 0, NULL);
            if (p) {
                held[nheld] = p;
                held_size[nheld++] = (ssize_t)n;
                reply("ok\n");
            } else {
                reply("oom %s\n", gradd_alloc_last_error());
            }
        } else if (strcmp(line, "freeall\n") == 0) {
            while (nheld > 0) {
                nheld--;
                gradd_free(held[nheld], held_size[nheld], 0, NULL);
            }
            reply("ok\n");
        } else if (strcmp(line, "stats\n") == 0) {
            reply("ok allocated=%llu reserved=%llu peak=%llu\n", (unsigned long long)gradd_memory_allocated(0),
                  (unsigned long long)gradd_memory_reserved(0), (unsigned long long)gradd_max_memory_allocated(0));
        } else if (strcmp(line, "fork\n") == 0) {
            do_fork();
        } else if (strcmp(line, "quit\n") == 0) {
            break;
        } else {
            reply("fail unknown command\n");
        }
    }
    gradd_alloc_shutdown();
    return 0;
}
