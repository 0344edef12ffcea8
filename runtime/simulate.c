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
    const cp_op *op;  /* the op running (--ranks: whose stand-ins a collective needs) */
    char *standin;    /* --ranks: the stand-in members' buffers of the largest collective */
    size_t standin_bytes;
} sim_rank;

struct sim_world {
    const cp_plan *plan;
    const cp_sim_options *opt;
    cp_host_world *host;
    cp_expect_cache *expect; /* expected grads, once per replicate group for all its members */
    sim_rank *ranks;
    int reporter; /* the rank whose thread prints progress */
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
            "shards, grads and checks %.2f GiB; --ranks auto checks one rank at a time in about one rank's "
            "memory); this machine has %.1f GiB available: simulate a smaller plan "
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
    char who[64];
    if (sw->opt->nonly > 0) snprintf(who, sizeof who, "rank %d alone", sw->reporter);
    else snprintf(who, sizeof who, "%d ranks", sw->plan->world_size);
    if (done < sw->opt->steps)
        fprintf(stderr, "%s: step %d/%d simulated on %s (%.1f s, about %.0f s left)\n", sw->plan->name, done,
                sw->opt->steps, who, t, t / done * (sw->opt->steps - done));
    else
        fprintf(stderr, "%s: step %d/%d simulated on %s (%.1f s)\n", sw->plan->name, done, sw->opt->steps, who, t);
}

/* Within a step, from the rank that reports: a line every few seconds
 * with the op it has reached. */
static void op_progress(const sim_rank *sr, int step, int i)
{
    const cp_sim_options *opt = sr->sw->opt;
    if (!opt->log) return;
    double t = since_start();
    if (t < progress.last + 3.0) return;
    progress.shown = 1;
    progress.last = t;
    const cp_plan *p = sr->ex.plan;
    const cp_op *op = &p->ops[i];
    fprintf(stderr, "%s: step %d/%d, op %d/%d (%s %s) on rank %d (%.1f s)\n", sr->sw->plan->name, step + 1,
            opt->steps, i + 1, p->nops, cp_op_kind_name(op->kind), p->units[op->unit].name, sr->rank, t);
}

/* cp_executor_step, op by op, so that progress and the stand-ins know the op. */
static int run_step(sim_rank *sr, int step, int reports)
{
    cp_executor *ex = &sr->ex;
    cp_backend *b = ex->backend;
    if (b->fork(b)) return -1;
    for (int i = 0; i < ex->plan->nops; i++) {
        sr->op = &ex->plan->ops[i];
        if (cp_executor_run_op(ex, sr->op) != 0) return -1;
        if (reports) op_progress(sr, step, i);
    }
    sr->op = NULL;
    return b->join(b);
}

/* A rank's failure stops every rank (cp_host_world_stop): the executor's
 * line, or for a failure of the checks themselves (they said why above)
 * one naming the rank. Only the first is printed, once, by cp_simulate. */
static void rank_failed(sim_rank *sr)
{
    char why[128];
    sr->error = 1;
    if (sr->ex.err[0]) {
        cp_host_world_stop(sr->sw->host, sr->rank, sr->ex.err);
        return;
    }
    snprintf(why, sizeof why, "rank %d: its checks failed (the line above says why)", sr->rank);
    cp_host_world_stop(sr->sw->host, sr->rank, why);
}

static void *rank_main(void *arg)
{
    sim_rank *sr = arg;
    const cp_sim_options *opt = sr->sw->opt;
    int reports = sr->rank == sr->sw->reporter;
    for (int s = 0; s < opt->steps && !sr->error; s++) {
        if (cp_harness_begin_step(&sr->harness, s) || run_step(sr, s, reports) ||
            cp_harness_end_step(&sr->harness)) {
            rank_failed(sr);
            break;
        }
        if (reports) sim_progress(sr->sw, s + 1);
    }
    if (!sr->error && cp_harness_finish(&sr->harness)) rank_failed(sr);
    return NULL;
}

/* ---- --ranks: one rank alone, its peers stand-ins (docs/simulate.md) ----
 * The rank runs the plan's ops over the host backend with every collective
 * handed here (cp_host_backend_init_cb); the other members' buffers are
 * made as they would hold them, from the same patterns the harness writes:
 * a shard group member's all-gather slot is its shards (the checker's
 * fill) rounded to the stored dtype and cast as its copy-in casts them
 * (cp_checker_fill_shards_as); its reduce-scatter input for
 * this rank's slot is its grads accumulated and packed by the checker's
 * model (cp_checker_member_packed); a TP peer's activation input is zeros
 * (the checker expects them: cp_checker.solo); replica m's all-reduce
 * input is this rank's values times m + 2, rounded to the reduce dtype
 * (the checker expects that too). The reductions run the host
 * backend's arithmetic (cp_reduce_arith_n over chain runs). */

static char *standin_room(sim_rank *sr, size_t bytes)
{
    if (bytes <= sr->standin_bytes) return sr->standin;
    free(sr->standin);
    sr->standin = malloc(bytes);
    sr->standin_bytes = sr->standin ? bytes : 0;
    return sr->standin;
}

/* The stand-ins' buffers in parts (cp_checker_in_parts: two threads for a
 * rank alone). */
typedef struct {
    int unit, key, size, micro, n;
    int part_first, part_count; /* a partial reduction's part (cp_op's) */
    cp_dtype t;
    char *out;
    size_t slot;
    const int *who;
    void *const *where;
} standin_job;

static void gather_part(cp_checker *c, void *arg, int part, int nparts)
{
    const standin_job *j = arg;
    for (int m = part; m < j->size; m += nparts)
        if (m != j->key) cp_checker_fill_shards_as(c, j->unit, m, j->t, j->out + (size_t)m * j->slot);
}

static void packed_part(cp_checker *c, void *arg, int part, int nparts)
{
    const standin_job *j = arg;
    int lo = j->n * part / nparts, hi = j->n * (part + 1) / nparts;
    if (hi > lo)
        cp_checker_member_packed(c, j->unit, j->part_first, j->part_count, j->who + lo, hi - lo, j->micro, j->where + lo);
}

static int solo_collective(void *user, int coll, int family, int color, int key, int size, void *in, void *out,
                           int64_t count, int dtype, int reduce_op)
{
    sim_rank *sr = user;
    const cp_op *op = sr->op;
    cp_checker *c = &sr->harness.check;
    cp_dtype t = (cp_dtype)dtype;
    cp_arith a = sr->sw->opt->arith;
    size_t es = cp_dtype_size(t), slot = (size_t)count * es;
    (void)family;
    (void)color;
    if (!op) return -1;
    const cp_unit *U = &sr->ex.plan->units[op->unit];
    if (coll == CP_COLL_ALL_GATHER) {
        char *o = out;
        if ((char *)in != o + (size_t)key * slot) memmove(o + (size_t)key * slot, in, slot);
        if (op->kind == CP_OP_TP_ALL_GATHER) { /* a TP peer's activation: zeros (docs/simulate.md) */
            for (int m = 0; m < size; m++)
                if (m != key) memset(o + (size_t)m * slot, 0, slot);
            return 0;
        }
        standin_job j = { .unit = op->unit, .key = key, .size = size, .t = U->ag_bytes > 0 ? CP_U8 : U->ag_dtype, .out = o,
                          .slot = slot };
        cp_checker_in_parts(c, gather_part, &j);
        return 0;
    }
    const void *ptr[size];
    char *room = standin_room(sr, (size_t)(size > 1 ? size - 1 : 1) * slot + 1);
    if (!room) {
        fprintf(stderr, "commplan: rank %d: out of host memory for %d stand-in members of %s\n", sr->rank, size - 1,
                cp_op_kind_name(op->kind));
        return -1;
    }
    int who[size], nwho = 0;
    void *where[size];
    for (int m = 0, j = 0; m < size; m++) {
        if (m == key) {
            ptr[m] = coll == CP_COLL_REDUCE_SCATTER ? (const char *)in + (size_t)key * slot : in;
            continue;
        }
        char *dst = room + (size_t)j++ * slot;
        ptr[m] = dst;
        switch (op->kind) {
        case CP_OP_REDUCE_SCATTER: /* below, all members at once */
            who[nwho] = (sr->ex.plan->units[op->unit].expert ? c->emembers : c->members)
                [c->replicate_rank * cp_unit_shard_size(sr->ex.plan, op->unit) + m];
            where[nwho++] = dst;
            break;
        case CP_OP_TP_REDUCE_SCATTER:
        case CP_OP_TP_ALL_REDUCE: memset(dst, 0, slot); break; /* a TP peer's activation: zeros */
        default: /* the HSDP all-reduce: replica m holds this one's values times m + 2 (the checker expects that) */
            for (int64_t i = 0; i < count; i += CP_BLOCK) {
                float v[CP_BLOCK];
                int64_t nb = count - i < CP_BLOCK ? count - i : CP_BLOCK;
                cp_load_n(t, (const char *)in + (size_t)i * es, nb, v);
                for (int64_t x = 0; x < nb; x++) v[x] *= (float)(m + 2);
                cp_store_n(t, dst + (size_t)i * es, nb, v);
            }
            break;
        }
    }
    if (nwho) {
        standin_job jp = { .unit = op->unit, .micro = op->micro_step, .n = nwho, .who = who, .where = where,
                           .part_first = op->part_first, .part_count = op->part_count };
        cp_checker_in_parts(c, packed_part, &jp);
    }
    const void *at[size];
    int64_t end;
    for (int64_t i = 0; i < count; i = end) {
        int chain = coll == CP_COLL_REDUCE_SCATTER ? cp_reduce_scatter_key_run(a, t, key, i, count, size, &end)
                                                   : cp_all_reduce_key_run(a, t, i, count, size, &end);
        for (int m = 0; m < size; m++) at[m] = (const char *)ptr[m] + (size_t)i * es;
        if (cp_reduce_arith_n(a, t, (cp_reduce_op)reduce_op, at, size, chain, end - i, (char *)out + (size_t)i * es)) {
            fprintf(stderr, "commplan: rank %d: out of host memory in %s\n", sr->rank, cp_op_kind_name(op->kind));
            return -1;
        }
    }
    return 0;
}

static int simulate_alone(const cp_plan *p, const cp_sim_options *opt)
{
    /* A pipeline rank alone would wait for its peers' messages (a receive
     * times out, as if the tables disagreed): there are no stand-ins for
     * sends and receives, so say so before anything runs. */
    if (p->pp_size > 1) {
        fprintf(stderr, "commplan: --ranks: plan %s is a pipeline plan (pp %d): a rank alone has no stand-ins for "
                "its pipeline peers' sends and receives; simulate all %d ranks (--simulate without --ranks)\n",
                p->name, p->pp_size, p->world_size);
        return 2;
    }
    int64_t per_rank, avail = cp_host_available_bytes(), room = 0;
    cp_simulate_bytes(p, &per_rank);
    for (int r = 0; r < opt->nonly; r++) {
        cp_plan v;
        cp_plan_view(p, opt->only[r], &v);
        for (int i = 0; i < v.nops; i++) {
            const cp_op *op = &v.ops[i];
            if (op->family < 0 || cp_op_descs[op->kind].action != CP_ACT_COLLECTIVE) continue;
            int64_t b = (int64_t)(p->families[op->family].size - 1) * op->count * (int64_t)cp_dtype_size(op->dtype);
            if (b > room) room = b;
        }
    }
    if (avail >= 0 && per_rank + room > avail) {
        fprintf(stderr, "commplan: simulating one rank of plan %s needs %.1f GiB of host memory (the rank %.2f GiB, its "
                "stand-in peers %.2f GiB); this machine has %.1f GiB available\n", p->name,
                gib(per_rank + room), gib(per_rank), gib(room), gib(avail));
        return 2;
    }
    sim_world sw = { .plan = p, .opt = opt };
    long bad = 0;
    int err = 0;
    clock_gettime(CLOCK_MONOTONIC, &progress.t0);
    progress.shown = 0;
    progress.last = 0;
    sw.host = cp_host_world_create(p);
    if (!sw.host) {
        fprintf(stderr, "commplan: out of host memory setting up plan %s's groups\n", p->name);
        return 2;
    }
    cp_host_world_set_arith(sw.host, opt->arith);
    for (int k = 0; k < opt->nonly && !err; k++) {
        int r = opt->only[k];
        sim_rank *sr = calloc(1, sizeof *sr);
        if (!sr) { err = 1; break; }
        sr->sw = &sw;
        sr->rank = r;
        sw.reporter = r;
        cp_host_backend_init_cb(&sr->backend, sw.host, r, solo_collective, sr);
        if (cp_executor_init(&sr->ex, p, r, &sr->backend) != 0 ||
            cp_harness_init(&sr->harness, &sr->ex, opt->pattern) != 0) {
            err = 1;
        } else {
            sr->harness.check.arith = opt->arith;
            sr->harness.check.solo = 1;
            /* Alone, the rank has the machine: its checks and stand-ins in two threads where there are two CPUs. */
            long cpus = sysconf(_SC_NPROCESSORS_ONLN);
            if (cpus >= 2) cp_checker_use_threads(&sr->harness.check, 2);
            if (opt->dump_dir && cp_harness_open_dump(&sr->harness, opt->dump_dir) != 0) err = 1;
            else {
                rank_main(sr);
                err |= sr->error;
                bad += sr->harness.check.mismatches;
                if (!sr->error && opt->log)
                    fprintf(opt->log, "%s: rank %d of %d simulated alone for %d step(s), its peers stand-ins: all its "
                            "unsharded params and reduced grads exact%s (%.1f s)\n", p->name, r, p->world_size,
                            opt->steps, sr->harness.check.mismatches ? " EXCEPT the mismatches above" : "",
                            since_start());
            }
        }
        cp_harness_free(&sr->harness);
        cp_executor_free(&sr->ex);
        free(sr->standin);
        free(sr);
    }
    cp_host_world_destroy(sw.host);
    if (err) return 2;
    if (bad) {
        fprintf(stderr, "commplan: %s: %ld mismatching elements over %d rank(s) simulated alone\n", p->name, bad,
                opt->nonly);
        return 1;
    }
    return 0;
}

int cp_simulate(const cp_plan *p, const cp_sim_options *opt)
{
    sim_world sw = { .plan = p, .opt = opt };
    int rc = 2;
    if (opt->nonly > 0) return simulate_alone(p, opt);
    if (cp_simulate_check_memory(p) != 0) return 2;
    clock_gettime(CLOCK_MONOTONIC, &progress.t0);
    progress.shown = 0;
    progress.last = 0;
    sw.host = cp_host_world_create(p);
    sw.expect = cp_expect_cache_create(p);
    sw.ranks = calloc((size_t)p->world_size, sizeof(sim_rank));
    if (!sw.host || !sw.expect || !sw.ranks) {
        fprintf(stderr, "commplan: out of host memory setting up %d simulated ranks\n", p->world_size);
        goto out;
    }
    int started = 0;
    cp_host_world_set_arith(sw.host, opt->arith);
    cp_host_world_set_timeout(sw.host, opt->timeout_s);
    for (int r = 0; r < p->world_size; r++) {
        sim_rank *sr = &sw.ranks[r];
        sr->sw = &sw;
        sr->rank = r;
        cp_host_backend_init(&sr->backend, sw.host, r);
        /* Quiet: the first failure stops every rank, and only its line is printed (below). */
        sr->ex.quiet = 1;
        if (cp_executor_init(&sr->ex, p, r, &sr->backend) != 0) goto join; /* its line: the stop's, below */
        if (cp_harness_init(&sr->harness, &sr->ex, opt->pattern) != 0) goto join;
        sr->harness.check.arith = opt->arith;
        sr->harness.check.cache = sw.expect;
        /* Opened before any thread starts: a rank failing alone would
         * leave its peers waiting in a collective. */
        if (opt->dump_dir && cp_harness_open_dump(&sr->harness, opt->dump_dir) != 0) goto join;
    }
    for (; started < p->world_size; started++) {
        if (pthread_create(&sw.ranks[started].thread, NULL, rank_main, &sw.ranks[started]) != 0) {
            /* The ranks already running would wait on the absent ones: stop them. */
            char why[128];
            snprintf(why, sizeof why, "cannot start the thread of rank %d; lower the plan's world size", started);
            cp_host_world_stop(sw.host, started, why);
            break;
        }
    }
join:
    for (int r = 0; r < started; r++) pthread_join(sw.ranks[r].thread, NULL);
    long bad = 0;
    int err = started < p->world_size;
    const char *why = cp_host_world_stopped(sw.host, NULL);
    if (why) fprintf(stderr, "commplan: %s\n", why); /* the first failure, once: the other ranks stopped on it */
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
