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

static uint32_t mix32(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

static float round_to(cp_dtype t, float v)
{
    float out;
    cp_store(t, &out, 0, v);
    return cp_load(t, &out, 0);
}

float cp_pattern_param(cp_pattern pat, cp_dtype t, int64_t k, int64_t base, int64_t e, int step)
{
    if (pat == CP_PATTERN_ORACLE) return (float)(k * 1000 + e + step);
    if (t == CP_FP32) /* < 2^22 plus quarter steps: exact in fp32, distinct per element */
        return (float)((base + e + 1) % 4000000) + 0.25f * (float)(step % 4);
    /* 16-bit types: a hashed bit pattern, exponent kept finite. */
    uint16_t h = (uint16_t)mix32(((uint64_t)k << 40) ^ ((uint64_t)e << 8) ^ (uint64_t)step);
    if (t == CP_BF16) {
        if ((h & 0x7f80u) == 0x7f80u) h &= (uint16_t)~0x4000u;
        return cp_bf16_to_float(h);
    }
    if ((h & 0x7c00u) == 0x7c00u) h &= (uint16_t)~0x4000u;
    return cp_fp16_to_float(h);
}

float cp_pattern_grad(cp_pattern pat, cp_dtype t, int64_t k, int64_t e, int rank, int micro, int step)
{
    if (pat == CP_PATTERN_ORACLE) return (float)(((e + k) % 5 + 1) * (rank + 1) * (micro + 1));
    uint32_t span = t == CP_FP32 ? 1024u : 8u;
    uint32_t g = 1u + mix32(((uint64_t)k << 32) ^ (uint64_t)e ^ ((uint64_t)step << 56)) % span;
    return (float)g * (float)(rank + 1) * (float)(micro + 1);
}

int64_t cp_pattern_param_id(const cp_plan *p, int param)
{
    for (int u = 0; u < p->nunits; u++) {
        const cp_unit *U = &p->units[u];
        if (param >= U->first_param && param < U->first_param + U->nparams)
            return 100 * (int64_t)u + (param - U->first_param);
    }
    return -1;
}

typedef struct sim_world sim_world;

typedef struct {
    sim_world *sw;
    int rank, step;
    cp_backend backend;
    cp_executor ex;
    FILE *dump;
    int dump_first_log;
    long mismatches;
    int error;
    pthread_t thread;
} sim_rank;

struct sim_world {
    const cp_plan *plan;
    const cp_sim_options *opt;
    cp_host_world *host;
    int64_t *param_base; /* prefix sums of numel, for unique values */
    sim_rank *ranks;
};

static void report(sim_rank *sr, const char *what, int u, int param, int64_t e, float want, float got)
{
    if (sr->mismatches++ == 0)
        fprintf(stderr,
                "commplan: mismatch: rank %d step %d unit %s param %s element %ld (%s): expected %.9g, got %.9g\n",
                sr->rank, sr->step, sr->sw->plan->units[u].name, sr->sw->plan->params[param].name, (long)e, what,
                (double)want, (double)got);
}

static int same(float a, float b) { return memcmp(&a, &b, sizeof a) == 0 || a == b; }

static float expected_param(const sim_world *sw, int u, int param, int64_t e, int step)
{
    const cp_unit *U = &sw->plan->units[u];
    float v = round_to(U->orig_dtype, cp_pattern_param(sw->opt->pattern, U->orig_dtype,
                                                       cp_pattern_param_id(sw->plan, param), sw->param_base[param],
                                                       e, step));
    return round_to(U->ag_dtype, v);
}

static int on_compute(void *user, cp_executor *ex, const cp_op *op)
{
    sim_rank *sr = user;
    const cp_plan *p = ex->plan;
    const cp_unit *U = &p->units[op->unit];
    int64_t W = p->shard_size;
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        const void *full = (const char *)ex->buf.unsharded[op->unit] +
                           (size_t)(W * prm->offset) * cp_dtype_size(U->ag_dtype);
        for (int64_t e = 0; e < prm->numel; e++) {
            float want = expected_param(sr->sw, op->unit, param, e, sr->step);
            float got = cp_load(U->ag_dtype, full, e);
            if (!same(want, got))
                report(sr, op->kind == CP_OP_FORWARD ? "unsharded param in forward" : "unsharded param in backward",
                       op->unit, param, e, want, got);
        }
        if (op->kind == CP_OP_BACKWARD) {
            void *g = (char *)ex->buf.grads[op->unit] +
                      (size_t)prm->grad_offset * cp_dtype_size(U->ag_dtype);
            int64_t k = cp_pattern_param_id(p, param);
            for (int64_t e = 0; e < prm->numel; e++) {
                float gv = round_to(U->ag_dtype, cp_pattern_grad(sr->sw->opt->pattern, U->ag_dtype, k, e, ex->rank,
                                                                 op->micro_step, sr->step));
                cp_store(U->ag_dtype, g, e, cp_load(U->ag_dtype, g, e) + gv);
            }
        }
    }
    return 0;
}

/* The reduced gradient element e of a parameter, as rank `rank` must hold it. */
static float expected_grad(const sim_world *sw, int u, int param, int64_t e, int rank)
{
    const cp_plan *p = sw->plan;
    const cp_unit *U = &p->units[u];
    int64_t k = cp_pattern_param_id(p, param);
    int W = p->shard_size, R = p->replicate_size;
    float rs[R > 0 ? R : 1];
    float vals[W > 0 ? W : 1];
    int rep_color = 0, rep_key = 0;
    if (p->replicate_family >= 0) cp_group_of(p, p->replicate_family, rank, &rep_color, &rep_key);
    for (int q = 0; q < R; q++) {
        int rq = p->replicate_family >= 0 ? cp_group_member(p, p->replicate_family, rep_color, q) : rank;
        int sh_color = 0, sh_key = 0;
        if (p->shard_family >= 0) cp_group_of(p, p->shard_family, rq, &sh_color, &sh_key);
        for (int s = 0; s < W; s++) {
            int g = p->shard_family >= 0 ? cp_group_member(p, p->shard_family, sh_color, s) : rq;
            float acc = 0.0f;
            for (int m = 0; m < p->micro_steps; m++)
                acc = round_to(U->ag_dtype,
                               acc + round_to(U->ag_dtype, cp_pattern_grad(sw->opt->pattern, U->ag_dtype, k, e, g,
                                                                           m, sw->ranks[rank].step)));
            vals[s] = round_to(U->reduce_dtype, (float)(acc / U->pre_divide));
        }
        rs[q] = W > 1 ? cp_reduce_values(U->reduce_dtype, U->rs_op, vals, W) : vals[0];
    }
    float v = R > 1 ? cp_reduce_values(U->reduce_dtype, U->ar_op, rs, R) : rs[0];
    return round_to(U->orig_dtype, (float)(v / U->post_divide));
}

static void init_step(sim_rank *sr)
{
    const cp_plan *p = sr->sw->plan;
    cp_executor *ex = &sr->ex;
    for (int u = 0; u < p->nunits; u++) {
        const cp_unit *U = &p->units[u];
        size_t es = cp_dtype_size(U->orig_dtype);
        memset(ex->buf.sharded[u], 0, (size_t)U->total * es);
        memset(ex->buf.sharded_grads[u], CP_POISON_BYTE, (size_t)U->total * es);
        for (int j = 0; j < U->nparams; j++) {
            int param = U->first_param + j;
            const cp_param *prm = &p->params[param];
            int64_t valid = cp_param_valid(prm, ex->shard_rank);
            for (int64_t i = 0; i < valid; i++) {
                int64_t e = cp_param_global_index(prm, p->shard_size, ex->shard_rank, i);
                cp_store(U->orig_dtype, ex->buf.sharded[u], prm->offset + i,
                         cp_pattern_param(sr->sw->opt->pattern, U->orig_dtype, cp_pattern_param_id(p, param),
                                          sr->sw->param_base[param], e, sr->step));
            }
        }
    }
}

static void check_grads(sim_rank *sr)
{
    const cp_plan *p = sr->sw->plan;
    cp_executor *ex = &sr->ex;
    for (int u = 0; u < p->nunits; u++) {
        const cp_unit *U = &p->units[u];
        for (int j = 0; j < U->nparams; j++) {
            int param = U->first_param + j;
            const cp_param *prm = &p->params[param];
            int64_t valid = cp_param_valid(prm, ex->shard_rank);
            for (int64_t i = 0; i < prm->padded; i++) {
                float got = cp_load(U->orig_dtype, ex->buf.sharded_grads[u], prm->offset + i);
                int64_t e = cp_param_global_index(prm, p->shard_size, ex->shard_rank, i);
                float want = i < valid ? expected_grad(sr->sw, u, param, e, ex->rank) : 0.0f;
                if (!same(want, got))
                    report(sr, i < valid ? "reduced sharded grad" : "grad padding", u, param, i < valid ? e : -1,
                           want, got);
            }
        }
    }
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
    sw.param_base = calloc((size_t)p->nparams, sizeof(int64_t));
    sw.ranks = calloc((size_t)p->world_size, sizeof(sim_rank));
    if (!sw.host || !sw.param_base || !sw.ranks) {
        fprintf(stderr, "commplan: out of host memory setting up %d simulated ranks\n", p->world_size);
        goto out;
    }
    for (int i = 1; i < p->nparams; i++) sw.param_base[i] = sw.param_base[i - 1] + p->params[i - 1].numel;
    int started = 0;
    for (int r = 0; r < p->world_size; r++) {
        sim_rank *sr = &sw.ranks[r];
        sr->sw = &sw;
        sr->rank = r;
        cp_host_backend_init(&sr->backend, sw.host, r);
        if (cp_executor_init(&sr->ex, p, r, &sr->backend) != 0) goto join;
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
        bad += sw.ranks[r].mismatches;
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
    free(sw.param_base);
    free(sw.ranks);
    return rc;
}
