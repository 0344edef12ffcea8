/* The simulation harness: one thread per rank over the host backend.
 * Parameters start from an element-unique pattern (different every step);
 * forward/backward placeholders check that every unsharded parameter is
 * rebuilt exactly and write per-rank gradients; after the step every
 * rank's sharded gradients are compared with an independent emulation of
 * the reduction (sum over the shard group, then the replicate group). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* sysconf(_SC_AVPHYS_PAGES) */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "host.h"
#include "safeio.h"
#include "simulate.h"

typedef struct sim_world sim_world;

typedef struct {
    sim_world *sw;
    int rank;
    cp_backend backend;
    cp_executor ex;
    cp_harness harness;
    int error;
    pthread_t thread;
} sim_rank;

struct sim_world {
    const cp_plan *plan;
    const cp_sim_options *opt;
    cp_host_world *host;
    cp_expect_cache *expect; /* expected grads, once per replicate group for all its members */
    sim_rank *ranks;
};

/* ---- memory needed up front, progress on long runs ---- */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

int64_t cp_simulate_bytes(const cp_plan *p, int64_t *per_rank)
{
    int64_t shards = 0, largest = 0;
    for (int u = 0; u < p->nunits; u++) {
        shards += cp_arena_buffer_bytes(p, u, CP_BUF_SHARDED) + cp_arena_buffer_bytes(p, u, CP_BUF_SHARDED_GRADS);
        for (int k = 0; k < CP_BUFFERS; k++) largest = max64(largest, cp_arena_buffer_bytes(p, u, (cp_buffer)k));
    }
    /* The checks' scratch (a host copy of the largest buffer), the host
     * copies of a collective's input and output for the observer (the same
     * bound), the checker's per-param table, thread stack and bookkeeping. */
    int64_t rank = p->arena_bytes + shards + 2 * largest + 8 * ((int64_t)p->nparams + 1) +
                   64 * ((int64_t)p->nunits + 1) + (256 << 10);
    if (per_rank) *per_rank = rank;
    return rank * p->world_size;
}

/* A small system file (regular, bounded: safeio.c) as text; NULL if unreadable. */
static const char *read_small(const char *path, char *buf, size_t max)
{
    size_t n;
    char err[512];
    return cp_read_file(path, buf, max, &n, err, sizeof err) == CP_READ_OK ? buf : NULL;
}

int64_t cp_host_available_bytes(void)
{
    enum { MAX_TEXT = 64 * 1024 };
    int64_t avail = -1;
    char *text = malloc(MAX_TEXT + 1), *lim_text = malloc(64 + 1);
    if (text && lim_text && read_small("/proc/meminfo", text, MAX_TEXT)) {
        const char *line = strstr(text, "MemAvailable:");
        long long kb;
        if (line && sscanf(line, "MemAvailable: %lld kB", &kb) == 1) avail = (int64_t)kb * 1024;
    }
#ifdef _SC_AVPHYS_PAGES
    if (avail < 0) {
        long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        if (pages > 0 && size > 0) avail = (int64_t)pages * size;
    }
#endif
    /* A container's cgroup limit (v2, then v1) can be far below the host's. */
    static const char *const limits[][2] = {
        { "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current" },
        { "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes" },
    };
    for (size_t i = 0; text && lim_text && i < sizeof limits / sizeof limits[0]; i++) {
        long long lim = -1, used = 0;
        if (read_small(limits[i][0], lim_text, 64) && sscanf(lim_text, "%lld", &lim) == 1 &&
            read_small(limits[i][1], text, 64) && sscanf(text, "%lld", &used) == 1 && lim > 0 && used >= 0 &&
            lim < (1LL << 60)) {
            int64_t room = lim > used ? (int64_t)(lim - used) : 0;
            if (avail < 0 || room < avail) avail = room;
        }
    }
    free(text);
    free(lim_text);
    return avail;
}

static double gib(int64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

int cp_simulate_check_memory(const cp_plan *p)
{
    int64_t per_rank, need = cp_simulate_bytes(p, &per_rank), avail = cp_host_available_bytes();
    if (avail < 0 || need <= avail) return 0;
    fprintf(stderr,
            "commplan: simulating plan %s needs %.1f GiB of host memory (%d ranks x %.2f GiB: arena %.2f GiB, "
            "shards, grads and checks %.2f GiB); this machine has %.1f GiB available: simulate a smaller plan "
            "(the same model with fewer layers or a smaller world), or run it on GPUs with --check\n",
            p->name, gib(need), p->world_size, gib(per_rank), gib(p->arena_bytes), gib(per_rank - p->arena_bytes),
            gib(avail));
    return -1;
}

static struct {
    struct timespec t0;
    int shown;
    double last; /* seconds at the last line */
} progress;

static double since_start(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - progress.t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - progress.t0.tv_nsec);
}

/* Rank 0 after each step (ranks move in lockstep through the collectives):
 * one line on stderr per step once the run has taken a second. */
static void sim_progress(const sim_world *sw, int done)
{
    if (!sw->opt->log) return;
    double t = since_start();
    if (t < 1.0 && !progress.shown) return;
    /* At most a line a second (and the last step's). */
    if (done < sw->opt->steps && progress.shown && t < progress.last + 1.0) return;
    progress.shown = 1;
    progress.last = t;
    if (done < sw->opt->steps)
        fprintf(stderr, "%s: step %d/%d simulated on %d ranks (%.1f s, about %.0f s left)\n", sw->plan->name, done,
                sw->opt->steps, sw->plan->world_size, t, t / done * (sw->opt->steps - done));
    else
        fprintf(stderr, "%s: step %d/%d simulated on %d ranks (%.1f s)\n", sw->plan->name, done, sw->opt->steps,
                sw->plan->world_size, t);
}

static void *rank_main(void *arg)
{
    sim_rank *sr = arg;
    const cp_sim_options *opt = sr->sw->opt;
    for (int s = 0; s < opt->steps && !sr->error; s++) {
        if (cp_harness_begin_step(&sr->harness, s) || cp_executor_step(&sr->ex) ||
            cp_harness_end_step(&sr->harness)) {
            sr->error = 1;
            break;
        }
        if (sr->rank == 0) sim_progress(sr->sw, s + 1);
    }
    if (!sr->error && cp_harness_finish(&sr->harness)) sr->error = 1;
    return NULL;
}

int cp_simulate(const cp_plan *p, const cp_sim_options *opt)
{
    sim_world sw = { .plan = p, .opt = opt };
    int rc = 2;
    if (cp_simulate_check_memory(p) != 0) return 2;
    clock_gettime(CLOCK_MONOTONIC, &progress.t0);
    progress.shown = 0;
    sw.host = cp_host_world_create(p);
    sw.expect = cp_expect_cache_create(p);
    sw.ranks = calloc((size_t)p->world_size, sizeof(sim_rank));
    if (!sw.host || !sw.expect || !sw.ranks) {
        fprintf(stderr, "commplan: out of host memory setting up %d simulated ranks\n", p->world_size);
        goto out;
    }
    int started = 0;
    cp_host_world_set_arith(sw.host, opt->arith);
    for (int r = 0; r < p->world_size; r++) {
        sim_rank *sr = &sw.ranks[r];
        sr->sw = &sw;
        sr->rank = r;
        cp_host_backend_init(&sr->backend, sw.host, r);
        if (cp_executor_init(&sr->ex, p, r, &sr->backend) != 0) goto join;
        if (cp_harness_init(&sr->harness, &sr->ex, opt->pattern) != 0) goto join;
        sr->harness.check.arith = opt->arith;
        sr->harness.check.cache = sw.expect;
        /* Opened before any thread starts: a rank failing alone would
         * leave its peers waiting in a collective. */
        if (opt->dump_dir && cp_harness_open_dump(&sr->harness, opt->dump_dir) != 0) goto join;
    }
    for (; started < p->world_size; started++) {
        if (pthread_create(&sw.ranks[started].thread, NULL, rank_main, &sw.ranks[started]) != 0) {
            fprintf(stderr, "commplan: cannot start thread for rank %d; lower the plan's world size\n", started);
            /* Ranks already running would wait forever on absent peers. */
            exit(2);
        }
    }
join:
    for (int r = 0; r < started; r++) pthread_join(sw.ranks[r].thread, NULL);
    long bad = 0;
    int err = started < p->world_size;
    for (int r = 0; r < p->world_size; r++) {
        bad += sw.ranks[r].harness.check.mismatches;
        err |= sw.ranks[r].error;
        cp_harness_free(&sw.ranks[r].harness);
        cp_executor_free(&sw.ranks[r].ex);
    }
    if (err) rc = 2;
    else if (bad) {
        fprintf(stderr, "commplan: %s: %ld mismatching elements over %d ranks\n", p->name, bad, p->world_size);
        rc = 1;
    } else {
        if (opt->log)
            fprintf(opt->log, "%s: simulated %d step(s) on %d ranks: all unsharded params and reduced grads exact\n",
                    p->name, opt->steps, p->world_size);
        rc = 0;
    }
out:
    cp_host_world_destroy(sw.host);
    cp_expect_cache_destroy(sw.expect);
    free(sw.ranks);
    return rc;
}
