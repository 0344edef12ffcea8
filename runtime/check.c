/* Patterns and exact checks; see check.h. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

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
    /* Hashed per micro-step too: a (micro+1) factor made every accumulated
     * grad a multiple of 3 at two micro-steps, which AVG over 3 ranks
     * divides exactly in any arithmetic, hiding ncclAvg's rounding. */
    uint32_t g = 1u + mix32(((uint64_t)k << 32) ^ (uint64_t)e ^ ((uint64_t)step << 56) ^
                            (uint64_t)micro * 0x9e3779b97f4a7c15ULL) % span;
    /* 16-bit grads: odd micro-steps 64 times smaller, so that a sum over
     * micro-steps rounds in 16 bits but not in fp32 and the dtype the
     * micro-steps accumulate in shows in every check. */
    float scale = t != CP_FP32 && (micro & 1) ? 0x1p-6f : 1.0f;
    return (float)g * (float)(rank + 1) * scale;
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

static int same(float a, float b) { return memcmp(&a, &b, sizeof a) == 0 || a == b; }

struct cp_expect_cache {
    const cp_plan *plan;
    int nsets; /* replicate group instances: world / replicate size */
    struct expect_slot {
        pthread_mutex_t lock;
        int step;    /* whose values vals holds; -1: none yet */
        float *vals; /* the unit's total elements as the replica set holds them */
    } *slots;        /* [unit * nsets + replica set] */
};

cp_expect_cache *cp_expect_cache_create(const cp_plan *p)
{
    cp_expect_cache *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->plan = p;
    x->nsets = p->world_size / (p->replicate_size > 0 ? p->replicate_size : 1);
    x->slots = calloc((size_t)p->nunits * (size_t)x->nsets, sizeof *x->slots);
    if (!x->slots) { free(x); return NULL; }
    for (int i = 0; i < p->nunits * x->nsets; i++) {
        pthread_mutex_init(&x->slots[i].lock, NULL);
        x->slots[i].step = -1;
    }
    return x;
}

void cp_expect_cache_destroy(cp_expect_cache *x)
{
    if (!x) return;
    for (int i = 0; i < x->plan->nunits * x->nsets; i++) {
        pthread_mutex_destroy(&x->slots[i].lock);
        free(x->slots[i].vals);
    }
    free(x->slots);
    free(x);
}

int cp_checker_init(cp_checker *c, const cp_plan *p, cp_pattern pattern, int rank)
{
    memset(c, 0, sizeof *c);
    c->plan = p;
    c->pattern = pattern;
    /* The GPU --check runs over NCCL; --simulate sets the host backend's. */
    c->arith = CP_ARITH_NCCL;
    c->rank = rank;
    c->shard_rank = cp_shard_rank(p, rank);
    c->tp_rank = cp_tp_rank(p, rank);
    int W = p->shard_size, R = p->replicate_size;
    int64_t biggest = 1;
    for (int u = 0; u < p->nunits; u++)
        if (p->units[u].total > biggest) biggest = p->units[u].total;
    int M = p->micro_steps > 0 ? p->micro_steps : 1;
    c->param_base = calloc((size_t)p->nparams + 1, sizeof(int64_t));
    c->members = malloc((size_t)W * (size_t)R * sizeof(int));
    c->expect = malloc((size_t)biggest * sizeof(float));
    c->packs = calloc((size_t)(p->nunits > 0 ? p->nunits : 1) * (size_t)M, 1);
    c->acc = malloc((size_t)W * (size_t)R * sizeof(float));
    if (!c->param_base || !c->members || !c->expect || !c->packs || !c->acc) { cp_checker_free(c); return -1; }
    /* Where the step reduces each unit: after every backward (FSDP2's
     * default), after the last (set_requires_gradient_sync(False) before
     * the others), as the plan's ops say. */
    for (int i = 0; i < p->nops; i++) {
        const cp_op *op = &p->ops[i];
        if (op->micro_step < 0 || op->micro_step >= M) continue;
        unsigned char *at = &c->packs[(size_t)op->unit * (size_t)M + (size_t)op->micro_step];
        if (op->kind == CP_OP_PACK) *at |= 1;
        if (op->kind == CP_OP_PARTIAL_SAVE || op->kind == CP_OP_PARTIAL_ADD) *at |= 2;
    }
    /* Patterns are functions of the full parameter's element index, so TP
     * ranks agree on every element they share. */
    for (int i = 1; i < p->nparams; i++) c->param_base[i] = c->param_base[i - 1] + cp_param_full_numel(&p->params[i - 1]);
    /* The W x R ranks whose grads reduce into this rank's shard: replicate
     * member q and, inside its shard group, member s. Every member of this
     * rank's replicate group (and no other rank) has the same list. */
    int rep_color = rank, rep_key = 0;
    if (p->replicate_family >= 0) cp_group_of(p, p->replicate_family, rank, &rep_color, &rep_key);
    c->replica_set = rep_color;
    for (int q = 0; q < R; q++) {
        int rq = p->replicate_family >= 0 ? cp_group_member(p, p->replicate_family, rep_color, q) : rank;
        int sh_color = 0, sh_key = 0;
        if (p->shard_family >= 0) cp_group_of(p, p->shard_family, rq, &sh_color, &sh_key);
        for (int s = 0; s < W; s++)
            c->members[q * W + s] = p->shard_family >= 0 ? cp_group_member(p, p->shard_family, sh_color, s) : rq;
    }
    return 0;
}

void cp_checker_free(cp_checker *c)
{
    free(c->param_base);
    free(c->members);
    free(c->expect);
    free(c->packs);
    free(c->acc);
    c->param_base = NULL;
    c->members = NULL;
    c->expect = NULL;
    c->packs = NULL;
    c->acc = NULL;
}

static void report(cp_checker *c, const char *what, int u, int param, int64_t e, float want, float got)
{
    if (c->mismatches++ == 0)
        fprintf(stderr,
                "commplan: mismatch: rank %d step %d unit %s param %s element %ld (%s): expected %.9g, got %.9g\n",
                c->rank, c->step, c->plan->units[u].name, c->plan->params[param].name, (long)e, what, (double)want,
                (double)got);
}

void cp_checker_fill_shards(cp_checker *c, int u, void *sharded)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    memset(sharded, 0, (size_t)U->total * cp_dtype_size(U->orig_dtype));
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        int64_t valid = cp_param_valid(prm, c->shard_rank);
        for (int64_t i = 0; i < valid; i++) {
            int64_t e = cp_param_full_index(prm, c->tp_rank, cp_param_global_index(prm, p->shard_size, c->shard_rank, i));
            cp_store(U->orig_dtype, sharded, prm->offset + i,
                     cp_pattern_param(c->pattern, U->orig_dtype, cp_pattern_param_id(p, param), c->param_base[param],
                                      e, c->step));
        }
    }
}

void cp_checker_check_unsharded(cp_checker *c, int u, const void *unsharded, const char *when)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        const void *full = (const char *)unsharded + (size_t)(p->shard_size * prm->offset) * cp_dtype_size(U->ag_dtype);
        int64_t k = cp_pattern_param_id(p, param);
        for (int64_t i = 0; i < prm->numel; i++) {
            int64_t e = cp_param_full_index(prm, c->tp_rank, i);
            float v = round_to(U->orig_dtype, cp_pattern_param(c->pattern, U->orig_dtype, k, c->param_base[param], e,
                                                               c->step));
            float want = round_to(U->ag_dtype, v);
            float got = cp_load(U->ag_dtype, full, i);
            if (!same(want, got)) report(c, when, u, param, e, want, got);
        }
    }
}

/* Whether micro-step m's backward writes unit u's unsharded grads afresh:
 * the step's first, or the first after a packing (which freed them). */
static int fresh_grads(const cp_checker *c, int u, int m)
{
    return m == 0 || (c->packs[(size_t)u * (size_t)c->plan->micro_steps + (size_t)(m - 1)] & 1);
}

static int reduces_at(const cp_checker *c, int u, int m)
{
    return c->packs[(size_t)u * (size_t)c->plan->micro_steps + (size_t)m] & 1;
}

/* Whether micro-step m's reduce-scatter output is parked in the partial
 * sums (all_reduce_last before the last micro-step) instead of all-reduced. */
static int parks_at(const cp_checker *c, int u, int m)
{
    return (c->packs[(size_t)u * (size_t)c->plan->micro_steps + (size_t)m] & 2) != 0;
}

void cp_checker_add_grads(cp_checker *c, int u, int micro, void *grads)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    int fresh = fresh_grads(c, u, micro);
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        void *g = (char *)grads + (size_t)prm->grad_offset * cp_dtype_size(U->grad_dtype);
        int64_t k = cp_pattern_param_id(p, param);
        for (int64_t i = 0; i < prm->numel; i++) {
            int64_t e = cp_param_full_index(prm, c->tp_rank, i);
            float gv = round_to(U->ag_dtype, cp_pattern_grad(c->pattern, U->ag_dtype, k, e, c->rank, micro, c->step));
            /* The micro-step's grad, computed in ag_dtype, into the grads
             * buffer (grad_dtype) as autograd's AccumulateGrad does with
             * the unsharded parameter's grad_dtype (torch 2.15): cast to it,
             * then assigned afresh or added in it. */
            gv = round_to(U->grad_dtype, gv);
            cp_store(U->grad_dtype, g, i, fresh ? gv : cp_load(U->grad_dtype, g, i) + gv);
        }
    }
}

/* A member's accumulated unsharded grad as it enters the reduce-scatter,
 * FSDP2's foreach_reduce: the cast to the reduce dtype, then the pre-divide
 * in it (div_ rounds to the reduce dtype). */
static float packed(const cp_unit *U, float acc)
{
    float v = round_to(U->reduce_dtype, acc);
    return U->pre_divide != 1.0 ? round_to(U->reduce_dtype, (float)(v / U->pre_divide)) : v;
}

/* Element e of parameter k of unit u in this rank's sharded grads after the
 * step; rs_key and key: the chains its reduce-scatter and all-reduce sum it
 * in (cp_reduce_arith; cp_reduce_scatter_key, cp_all_reduce_key). Every
 * micro-step, each of the W x R members' grads (computed in the compute
 * dtype) is cast to the unit's grad dtype and assigned afresh or added in
 * it into its unsharded accumulation (torch 2.15's AccumulateGrad with
 * grad_dtype = reduce_dtype; a grad dtype wider than the compute dtype
 * casts exactly). Where the step reduces the unit: packed, reduced over
 * each shard group (the value this shard rank gets), over the replicate
 * group, post-divided in the reduce dtype and cast to the parameter's
 * dtype; the step's first reduction assigns the sharded grad, later ones
 * add into it in its dtype (sharded_param.grad += new_sharded_grad).
 * all_reduce_last: a reduction before the last micro-step keeps each
 * replica's reduce-scatter value in its partial sum (assigned, then added in
 * the reduce dtype); the last adds its own value and the partial sum
 * (reduce_output += partial_reduce_output) before the all-reduce. */
static float expect_element(const cp_checker *c, int u, int64_t k, int64_t e, int rs_key, int key)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    int W = p->shard_size, R = p->replicate_size;
    float vals[W > 0 ? W : 1], rs[R > 0 ? R : 1], partial[R > 0 ? R : 1];
    float sharded = 0.0f;
    int have = 0, held = 0;
    for (int m = 0; m < p->micro_steps; m++) {
        int fresh = fresh_grads(c, u, m);
        for (int i = 0; i < W * R; i++) {
            float g = round_to(U->ag_dtype, cp_pattern_grad(c->pattern, U->ag_dtype, k, e, c->members[i], m, c->step));
            g = round_to(U->grad_dtype, g);
            c->acc[i] = round_to(U->grad_dtype, fresh ? g : c->acc[i] + g);
        }
        if (!reduces_at(c, u, m)) continue;
        for (int q = 0; q < R; q++) {
            for (int s = 0; s < W; s++) vals[s] = packed(U, c->acc[q * W + s]);
            rs[q] = W > 1 ? cp_reduce_arith(c->arith, U->reduce_dtype, U->rs_op, vals, W, rs_key) : vals[0];
        }
        if (parks_at(c, u, m)) {
            for (int q = 0; q < R; q++) partial[q] = held ? round_to(U->reduce_dtype, partial[q] + rs[q]) : rs[q];
            held = 1;
            continue;
        }
        if (held)
            for (int q = 0; q < R; q++) rs[q] = round_to(U->reduce_dtype, rs[q] + partial[q]);
        held = 0;
        float v = R > 1 ? cp_reduce_arith(c->arith, U->reduce_dtype, U->ar_op, rs, R, key) : rs[0];
        if (U->post_divide != 1.0) v = round_to(U->reduce_dtype, (float)(v / U->post_divide));
        v = round_to(U->orig_dtype, v);
        sharded = have ? round_to(U->orig_dtype, sharded + v) : v;
        have = 1;
    }
    return sharded;
}

/* Every reduced grad element of unit u as this rank must hold it (padding
 * is not written). */
static void expect_unit(const cp_checker *c, int u, float *out)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    int R = p->replicate_size;
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        int64_t k = cp_pattern_param_id(p, param);
        int64_t valid = cp_param_valid(prm, c->shard_rank);
        for (int64_t i = 0; i < valid; i++) {
            int64_t e = cp_param_full_index(prm, c->tp_rank, cp_param_global_index(prm, p->shard_size, c->shard_rank, i));
            int64_t at = prm->offset + i;
            out[at] = expect_element(c, u, k, e,
                                     cp_reduce_scatter_key(c->arith, U->reduce_dtype, c->shard_rank, at, U->total,
                                                           p->shard_size),
                                     cp_all_reduce_key(c->arith, U->reduce_dtype, at, U->total, R));
        }
    }
}

/* NCCL's ring all-reduce finishes element `at` of the unit's buffer on a ring
 * position that depends on its channel and chunk split, NCCL's run-time
 * choice: got may be the bits of any position that split can give it
 * (0 .. cp_nccl_all_reduce_max_key: the first 16 bytes always finish on
 * position 0), each position's value worked out in full; no other. */
static int any_ring_order(const cp_checker *c, int u, int64_t k, int64_t e, int64_t at, float got)
{
    int R = c->plan->replicate_size;
    if (c->arith != CP_ARITH_NCCL || R < 2) return 0;
    int last = cp_nccl_all_reduce_max_key(c->plan->units[u].reduce_dtype, at, R);
    for (int key = 0; key <= last; key++)
        if (same(expect_element(c, u, k, e, c->shard_rank, key), got)) return 1;
    return 0;
}

static void compare_grads(cp_checker *c, int u, const float *want, const void *sharded_grads)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        int64_t valid = cp_param_valid(prm, c->shard_rank);
        for (int64_t i = 0; i < prm->padded; i++) {
            float got = cp_load(U->orig_dtype, sharded_grads, prm->offset + i);
            int64_t e = cp_param_full_index(prm, c->tp_rank, cp_param_global_index(prm, p->shard_size, c->shard_rank, i));
            float w = i < valid ? want[prm->offset + i] : 0.0f;
            if (same(w, got)) continue;
            if (i < valid && any_ring_order(c, u, cp_pattern_param_id(p, param), e, prm->offset + i, got)) continue;
            report(c, i < valid ? "reduced sharded grad" : "grad padding", u, param, i < valid ? e : -1, w, got);
        }
    }
}

void cp_checker_check_grads(cp_checker *c, int u, const void *sharded_grads)
{
    struct expect_slot *sl = NULL;
    if (c->cache) sl = &c->cache->slots[u * c->cache->nsets + c->replica_set];
    if (sl) {
        /* The replica set's members take turns; the first at a step fills it. */
        pthread_mutex_lock(&sl->lock);
        if (!sl->vals) sl->vals = malloc((size_t)c->plan->units[u].total * sizeof(float) + 1);
        if (sl->vals) {
            if (sl->step != c->step) {
                expect_unit(c, u, sl->vals);
                sl->step = c->step;
            }
            compare_grads(c, u, sl->vals, sharded_grads);
            pthread_mutex_unlock(&sl->lock);
            return;
        }
        pthread_mutex_unlock(&sl->lock); /* out of memory: compute alone */
    }
    expect_unit(c, u, c->expect);
    compare_grads(c, u, c->expect, sharded_grads);
}

/* ---- TP activation collectives ----
 * The compute around them is a placeholder too: before each one, every TP
 * rank writes its input from a pattern; after it, the output is checked
 * exactly. Gathers carry hashed values (any bits the dtype holds); sums
 * carry small integers, 1..4 per rank, so a TP group of up to 64 sums
 * exactly even in bf16 (<= 256), and every element depends on its position
 * and the op, so a wrong offset or a stale buffer shows. */
static float act_gathered(cp_dtype t, int64_t op_index, int64_t pos, int step)
{
    uint32_t h = mix32(((uint64_t)op_index << 40) ^ ((uint64_t)pos << 4) ^ (uint64_t)step);
    if (t == CP_FP32) return (float)(h % 2000000u) - 1000000.0f;
    uint16_t bits = (uint16_t)h;
    if (t == CP_BF16 && (bits & 0x7f80u) == 0x7f80u) bits &= (uint16_t)~0x4000u;
    if (t == CP_FP16 && (bits & 0x7c00u) == 0x7c00u) bits &= (uint16_t)~0x4000u;
    return t == CP_BF16 ? cp_bf16_to_float(bits) : cp_fp16_to_float(bits);
}

static float act_summand(int64_t op_index, int64_t pos, int step, int tp_rank)
{
    return (float)(mix32(((uint64_t)op_index << 40) ^ ((uint64_t)pos << 4) ^ (uint64_t)step) % 3u + 1u) +
           (float)(tp_rank % 2);
}

void cp_checker_act_input(cp_checker *c, const cp_op *op, int tp_rank, int tp_size, void *in)
{
    int64_t seq = op - c->plan->ops;
    int64_t n = op->count;
    if (op->kind == CP_OP_TP_ALL_GATHER) {
        for (int64_t i = 0; i < n; i++)
            cp_store(op->dtype, in, i, act_gathered(op->dtype, seq, (int64_t)tp_rank * n + i, c->step));
        return;
    }
    int64_t len = op->kind == CP_OP_TP_REDUCE_SCATTER ? n * tp_size : n;
    for (int64_t i = 0; i < len; i++) cp_store(op->dtype, in, i, act_summand(seq, i, c->step, tp_rank));
}

void cp_checker_act_output(cp_checker *c, const cp_op *op, int tp_rank, int tp_size, const void *out)
{
    int64_t seq = op - c->plan->ops;
    int64_t n = op->count;
    int gather = op->kind == CP_OP_TP_ALL_GATHER;
    int64_t len = gather ? n * tp_size : n, base = op->kind == CP_OP_TP_REDUCE_SCATTER ? (int64_t)tp_rank * n : 0;
    for (int64_t i = 0; i < len; i++) {
        float want = 0.0f;
        if (gather) want = act_gathered(op->dtype, seq, i, c->step);
        else if (op->reduce_op == CP_MAX) /* loss_parallel's per-token max */
            for (int r = 0; r < tp_size; r++) want = r == 0 ? act_summand(seq, base + i, c->step, r)
                                                           : fmaxf(want, act_summand(seq, base + i, c->step, r));
        else
            for (int r = 0; r < tp_size; r++) want += act_summand(seq, base + i, c->step, r);
        float got = cp_load(op->dtype, out, i);
        if (!same(want, got) && c->mismatches++ == 0)
            fprintf(stderr, "commplan: mismatch: rank %d step %d unit %s op %ld (%s) element %ld: expected %.9g, got "
                    "%.9g\n", c->rank, c->step, c->plan->units[op->unit].name, (long)seq, cp_op_kind_name(op->kind),
                    (long)i, (double)want, (double)got);
    }
}
