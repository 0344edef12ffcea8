/* The simulation harness: one thread per rank over the host backend.
 * Parameters start from an element-unique pattern (different every step);
 * forward/backward placeholders check that every unsharded parameter is
 * rebuilt exactly and write per-rank gradients; after the step every
 * rank's sharded gradients are compared with an independent emulation of
 * the reduction (sum over the shard group, then the replicate group). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host.h"
#include "simulate.h"

typedef struct sim_world sim_world;

typedef struct {
    sim_world *sw;
    int rank, step;
    cp_backend backend;
    cp_executor ex;
    FILE *dump;
    int dump_first_log;
    cp_checker check;
    int error;
    pthread_t thread;
} sim_rank;

struct sim_world {
    const cp_plan *plan;
    const cp_sim_options *opt;
    cp_host_world *host;
    sim_rank *ranks;
};

static int on_compute(void *user, cp_executor *ex, const cp_op *op)
{
    sim_rank *sr = user;
    cp_checker_check_unsharded(&sr->check, op->unit, ex->buf.unsharded[op->unit],
                               op->kind == CP_OP_FORWARD ? "unsharded param in forward" : "unsharded param in backward");
    if (op->kind == CP_OP_BACKWARD) cp_checker_add_grads(&sr->check, op->unit, op->micro_step, ex->buf.grads[op->unit]);
    return 0;
}

static void init_step(sim_rank *sr)
{
    const cp_plan *p = sr->sw->plan;
    sr->check.step = sr->step;
    for (int u = 0; u < p->nunits; u++) {
        cp_checker_fill_shards(&sr->check, u, sr->ex.buf.sharded[u]);
        memset(sr->ex.buf.sharded_grads[u], CP_POISON_BYTE,
               (size_t)p->units[u].total * cp_dtype_size(p->units[u].orig_dtype));
    }
}

static void check_grads(sim_rank *sr)
{
    for (int u = 0; u < sr->sw->plan->nunits; u++) cp_checker_check_grads(&sr->check, u, sr->ex.buf.sharded_grads[u]);
}

/* ---- dump in the recordings' format (step 0 only) ---- */

static void dump_values(FILE *f, cp_dtype t, const void *base, int64_t off, int64_t n)
{
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) fprintf(f, "%s%.9g", i ? "," : "", (double)cp_load(t, base, off + i));
    fputc(']', f);
}

static const char *torch_dtype(cp_dtype t)
{
    return t == CP_FP32 ? "torch.float32" : t == CP_BF16 ? "torch.bfloat16" : "torch.float16";
}

static void dump_locals(sim_rank *sr, int grads)
{
    const cp_plan *p = sr->sw->plan;
    FILE *f = sr->dump;
    fprintf(f, "\"%s\":{", grads ? "grads_local" : "params_local");
    for (int param = 0, first = 1; param < p->nparams; param++) {
        int u = 0;
        while (!(param >= p->units[u].first_param && param < p->units[u].first_param + p->units[u].nparams)) u++;
        const cp_unit *U = &p->units[u];
        const cp_param *prm = &p->params[param];
        fprintf(f, "%s\"%s\":{\"values\":", first ? "" : ",", prm->name);
        first = 0;
        dump_values(f, U->orig_dtype, grads ? sr->ex.buf.sharded_grads[u] : sr->ex.buf.sharded[u], prm->offset,
                    cp_param_valid(prm, sr->ex.shard_rank));
        fputc('}', f);
    }
    fputc('}', f);
}

static void on_collective(void *user, cp_executor *ex, const cp_op *op, const void *in, int64_t in_n,
                          const void *out, int64_t out_n)
{
    sim_rank *sr = user;
    if (!sr->dump || sr->step != 0) return;
    const cp_plan *p = ex->plan;
    FILE *f = sr->dump;
    int color, key;
    cp_group_of(p, op->family, ex->rank, &color, &key);
    static const char *const names[] = { [CP_OP_ALL_GATHER] = "all_gather", [CP_OP_REDUCE_SCATTER] = "reduce_scatter",
                                         [CP_OP_ALL_REDUCE] = "all_reduce" };
    fprintf(f, "%s{\"op\":\"%s\",\"unit\":\"%s\",\"ranks\":[", sr->dump_first_log ? "" : ",\n", names[op->kind],
            p->units[op->unit].name);
    sr->dump_first_log = 0;
    for (int m = 0; m < p->families[op->family].size; m++)
        fprintf(f, "%s%d", m ? "," : "", cp_group_member(p, op->family, color, m));
    fprintf(f, "],\"dtype\":\"%s\"", torch_dtype(op->dtype));
    if (op->kind != CP_OP_ALL_GATHER) fprintf(f, ",\"reduce_op\":\"RedOpType.%s\"", op->reduce_op == CP_AVG ? "AVG" : "SUM");
    fprintf(f, ",\"in_numel\":%ld,\"out_numel\":%ld,\"in\":", (long)in_n, (long)out_n);
    dump_values(f, op->dtype, in, 0, in_n);
    fputs(",\"out\":", f);
    dump_values(f, op->dtype, out, 0, out_n);
    fputc('}', f);
}

static int open_dump(sim_rank *sr)
{
    const char *dir = sr->sw->opt->dump_dir;
    if (!dir) return 0;
    /* mkdir -p: every rank may race here, so EEXIST is fine. */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *s = tmp + 1;; s++) {
        int end = *s == '\0';
        if (*s == '/' || end) {
            *s = '\0';
            if (mkdir(tmp, 0777) != 0 && errno != EEXIST) {
                fprintf(stderr, "commplan: --dump %s: cannot create directory %s: %s\n", dir, tmp, strerror(errno));
                return -1;
            }
            if (end) break;
            *s = '/';
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.rank%d.json", dir, sr->sw->plan->name, sr->rank);
    sr->dump = fopen(path, "w");
    if (!sr->dump) {
        fprintf(stderr, "commplan: --dump: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Step 0's header and local shards, written once its shards are filled. */
static void dump_begin(sim_rank *sr)
{
    fprintf(sr->dump, "{\"rank\":%d,\"world\":%d,\n", sr->rank, sr->sw->plan->world_size);
    dump_locals(sr, 0);
    fputs(",\n\"log\":[\n", sr->dump);
    sr->dump_first_log = 1;
}

static void *rank_main(void *arg)
{
    sim_rank *sr = arg;
    const cp_sim_options *opt = sr->sw->opt;
    for (int s = 0; s < opt->steps && !sr->error; s++) {
        sr->step = s;
        init_step(sr);
        if (s == 0 && sr->dump) dump_begin(sr);
        if (cp_executor_step(&sr->ex) != 0) { sr->error = 1; break; }
        check_grads(sr);
        if (s == 0 && sr->dump) {
            fputs("],\n", sr->dump);
            dump_locals(sr, 1);
            fputs("}\n", sr->dump);
            if (fclose(sr->dump) != 0) sr->error = 1;
            sr->dump = NULL;
        }
    }
    return NULL;
}

int cp_simulate(const cp_plan *p, const cp_sim_options *opt)
{
    sim_world sw = { .plan = p, .opt = opt };
    int rc = 2;
    sw.host = cp_host_world_create(p);
    sw.ranks = calloc((size_t)p->world_size, sizeof(sim_rank));
    if (!sw.host || !sw.ranks) {
        fprintf(stderr, "commplan: out of host memory setting up %d simulated ranks\n", p->world_size);
        goto out;
    }
    int started = 0;
    for (int r = 0; r < p->world_size; r++) {
        sim_rank *sr = &sw.ranks[r];
        sr->sw = &sw;
        sr->rank = r;
        cp_host_backend_init(&sr->backend, sw.host, r);
        if (cp_executor_init(&sr->ex, p, r, &sr->backend) != 0) goto join;
        if (cp_checker_init(&sr->check, p, opt->pattern, r) != 0) {
            fprintf(stderr, "commplan: out of host memory for rank %d's checks\n", r);
            goto join;
        }
        sr->ex.on_compute = on_compute;
        sr->ex.on_collective = on_collective;
        sr->ex.user = sr;
        /* Opened before any thread starts: a rank failing alone would
         * leave its peers waiting in a collective. */
        if (open_dump(sr) != 0) goto join;
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
        bad += sw.ranks[r].check.mismatches;
        cp_checker_free(&sw.ranks[r].check);
        err |= sw.ranks[r].error;
        if (sw.ranks[r].dump) fclose(sw.ranks[r].dump);
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
    free(sw.ranks);
    return rc;
}
