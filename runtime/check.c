/* Patterns and exact checks; see check.h. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cp_simd.h"

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

/* Whether any of n pairs is not same(). */
CP_HOT static int differ_n(const float *restrict a, const float *restrict b, int64_t n)
{
    int bad = 0;
    CP_LOOP(n, uint32_t x; uint32_t y; memcpy(&x, a + j, 4); memcpy(&y, b + j, 4); bad |= (x != y) & !(a[j] == b[j]));
    return bad;
}

/* ---- two threads for a rank simulated alone (c->threads, --ranks) ----
 * fn(c, arg, part, nparts) does part `part` of the work; with a second
 * thread the helper runs part 1 on a copy of the checker with its own
 * scratch, and its mismatches are added after. The parts write disjoint
 * elements. */
typedef struct {
    cp_checker *c;
    void (*fn)(cp_checker *c, void *arg, int part, int nparts);
    void *arg;
} part_job;

static void *part_main(void *p)
{
    part_job *j = p;
    j->fn(j->c, j->arg, 1, 2);
    return NULL;
}

void cp_checker_in_parts(cp_checker *c, void (*fn)(cp_checker *c, void *arg, int part, int nparts), void *arg)
{
    if (c->threads < 2 || !c->helper_work) { fn(c, arg, 0, 1); return; }
    cp_checker h = *c;
    h.work = c->helper_work;
    h.helper_work = NULL;
    h.threads = 1;
    long before = c->mismatches;
    part_job j = { &h, fn, arg };
    pthread_t t;
    if (pthread_create(&t, NULL, part_main, &j) != 0) { fn(c, arg, 0, 1); return; }
    fn(c, arg, 0, 2);
    pthread_join(t, NULL);
    c->mismatches += h.mismatches - before;
}

/* The arguments of the activation checks' parts. */
typedef struct {
    const cp_op *op;
    int tp_rank, tp_size;
    const void *out;
    void *in;
    int64_t first, len;
} act_job;

/* Part `part` of nparts of [0, n): whole blocks, the last part the rest. */
static void part_range(int64_t n, int part, int nparts, int64_t *lo, int64_t *hi)
{
    int64_t blocks = (n + CP_BLOCK - 1) / CP_BLOCK;
    *lo = blocks * part / nparts * CP_BLOCK;
    *hi = part == nparts - 1 ? n : blocks * (part + 1) / nparts * CP_BLOCK;
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
}

/* ---- the patterns over runs of elements (bit for bit the functions above) ---- */

/* (float)(x + j) + q, j < n: the fp32 pattern between two wraps. */
CP_HOT static void fp32_ramp(float *restrict out, int32_t x, int64_t n, float q)
{
    CP_LOOP(n, out[j] = (float)(x + (int32_t)j) + q);
}

/* The 16-bit pattern's bits: the hash of (k, e, step), its exponent kept
 * finite (exp: the dtype's exponent mask). */
CP_HOT static void hash16(uint16_t *restrict h, uint64_t kbits, int64_t e0, int64_t n, uint64_t step, uint32_t exp)
{
    CP_LOOP(n, uint32_t b = (uint16_t)mix32(kbits ^ ((uint64_t)(e0 + j) << 8) ^ step);
               h[j] = (uint16_t)((b & exp) == exp ? b & ~0x4000u : b));
}

/* out[j] = cp_pattern_param(pat, t, k, base, e0 + j, step), j < n. */
static void param_n(cp_pattern pat, cp_dtype t, int64_t k, int64_t base, int64_t e0, int64_t n, int step, float *out)
{
    if (pat == CP_PATTERN_ORACLE) {
        for (int64_t j = 0; j < n; j++) out[j] = (float)(k * 1000 + e0 + j + step);
        return;
    }
    if (t == CP_FP32) {
        int64_t x = (base + e0 + 1) % 4000000;
        float q = 0.25f * (float)(step % 4);
        for (int64_t j = 0; j < n;) {
            int64_t m = 4000000 - x < n - j ? 4000000 - x : n - j; /* up to the wrap */
            fp32_ramp(out + j, (int32_t)x, m, q);
            j += m;
            x = 0;
        }
        return;
    }
    uint16_t h[CP_BLOCK];
    for (int64_t j0 = 0; j0 < n; j0 += CP_BLOCK) {
        int64_t m = n - j0 < CP_BLOCK ? n - j0 : CP_BLOCK;
        hash16(h, (uint64_t)k << 40, e0 + j0, m, (uint64_t)step, t == CP_BF16 ? 0x7f80u : 0x7c00u);
        cp_load_n(t, h, m, out + j0);
    }
}

/* The rank-independent factor of cp_pattern_grad's unique pattern:
 * (float)g for e0 .. e0+n-1 (the value is g * (rank + 1) * scale). */
CP_HOT static void grad_base_n(cp_dtype t, int64_t k, int64_t e0, int64_t n, int micro, int step, float *restrict out)
{
    uint32_t mask = t == CP_FP32 ? 1023u : 7u; /* % 1024 or % 8 */
    uint64_t salt = ((uint64_t)k << 32) ^ ((uint64_t)step << 56) ^ ((uint64_t)micro * 0x9e3779b97f4a7c15ULL);
    CP_LOOP(n, out[j] = (float)(int32_t)(1u + (mix32(salt ^ (uint64_t)(e0 + j)) & mask)));
}

CP_HOT static void scale_n(float *restrict out, const float *restrict base, int64_t n, float r, float scale)
{
    CP_LOOP(n, out[j] = base[j] * r * scale);
}

/* out[j] = cp_pattern_grad(pat, t, k, e0 + j, rank, micro, step), j < n;
 * base: grad_base_n's values for the unique pattern (NULL for oracle). */
static void grad_n(cp_pattern pat, cp_dtype t, int64_t k, int64_t e0, int64_t n, int rank, int micro, int step,
                   const float *base, float *out)
{
    if (pat == CP_PATTERN_ORACLE) {
        for (int64_t j = 0; j < n; j++) out[j] = cp_pattern_grad(pat, t, k, e0 + j, rank, micro, step);
        return;
    }
    float r = (float)(rank + 1), scale = t != CP_FP32 && (micro & 1) ? 0x1p-6f : 1.0f;
    scale_n(out, base, n, r, scale);
}

/* Elements of a parameter in runs whose full-parameter indices are
 * consecutive. Unsharded local element i: its full index, and in *len how
 * many from i on follow it one by one. */
static int64_t full_run(const cp_param *prm, int tp_rank, int64_t i, int64_t limit, int64_t *len)
{
    int64_t n = limit - i;
    if (prm->tp_sharded) {
        int64_t inner = 1;
        for (int d = prm->tp_dim + 1; d < prm->ndim; d++) inner *= prm->shape[d];
        int64_t block = prm->shape[prm->tp_dim] * inner; /* one outer index's rows: consecutive in the full tensor */
        if (block > 0 && block - i % block < n) n = block - i % block;
    }
    *len = n;
    return cp_param_full_index(prm, tp_rank, i);
}

/* Shard-local element j (< limit) of shard rank s: the same over the
 * parameter's chunk runs. */
static int64_t shard_run(const cp_param *prm, int W, int s, int tp_rank, int64_t j, int64_t limit, int64_t *len)
{
    int64_t n = limit - j;
    if (prm->run > 0 && prm->run - j % prm->run < n) n = prm->run - j % prm->run;
    int64_t g = cp_param_global_index(prm, W, s, j), m;
    int64_t e = full_run(prm, tp_rank, g, g + n, &m);
    *len = m;
    return e;
}

/* A unit's shard group as the checker sees it: the plan's, or expert
 * parallelism's experts' own (efsdp), their rows picked by the rank's ep key
 * instead of its TP coordinate (cp_unit.expert). */
static int U_W(const cp_checker *c, int u) { return cp_unit_shard_size(c->plan, u); }
static int U_SR(const cp_checker *c, int u) { return c->plan->units[u].expert ? c->eshard_rank : c->shard_rank; }
static int U_TR(const cp_checker *c, int u) { return c->plan->units[u].expert ? c->esplit_rank : c->tp_rank; }
static const int *U_MEM(const cp_checker *c, int u) { return c->plan->units[u].expert ? c->emembers : c->members; }

struct cp_expect_cache {
    const cp_plan *plan;
    int nunits; /* the most units any class has (a pipeline rank's class has its stages') */
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
    x->nunits = p->nunits;
    for (int c = 0; p->classes && c < p->nclasses; c++)
        if (p->classes[c].nunits > x->nunits) x->nunits = p->classes[c].nunits;
    x->nsets = p->world_size / (p->replicate_size > 0 ? p->replicate_size : 1);
    x->slots = calloc((size_t)(x->nunits > 0 ? x->nunits : 1) * (size_t)x->nsets, sizeof *x->slots);
    if (!x->slots) { free(x); return NULL; }
    for (int i = 0; i < x->nunits * x->nsets; i++) {
        pthread_mutex_init(&x->slots[i].lock, NULL);
        x->slots[i].step = -1;
    }
    return x;
}

void cp_expect_cache_destroy(cp_expect_cache *x)
{
    if (!x) return;
    for (int i = 0; i < x->nunits * x->nsets; i++) {
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
    int We_max = W; /* an experts unit's shard group (efsdp) is larger than dp_shard where ep < tp */
    for (int u = 0; u < p->nunits; u++)
        if (p->units[u].expert && p->units[u].shard_size > We_max) We_max = p->units[u].shard_size;
    c->emembers = malloc((size_t)We_max * (size_t)R * sizeof(int));
    c->expect = malloc((size_t)biggest * sizeof(float));
    /* Cells: each unit's parameters cut where a part (cp_op.part_first /
     * part_count: a partial reduction and the compute that makes its grads)
     * begins or ends; a cell's grads are made and reduced together. */
    c->cell_of = malloc((size_t)(p->nparams > 0 ? p->nparams : 1) * sizeof(int));
    {
        unsigned char *cut = calloc((size_t)p->nparams + 1, 1);
        if (!c->cell_of || !cut) { free(cut); cp_checker_free(c); return -1; }
        for (int i = 0; i < p->nops; i++) {
            const cp_op *op = &p->ops[i];
            if (op->part_count <= 0 || cp_part_check(p, op->unit, op->part_first, op->part_count)) continue;
            const cp_unit *U = &p->units[op->unit];
            cut[U->first_param + op->part_first] = 1;
            cut[U->first_param + op->part_first + op->part_count] = 1;
        }
        int n = 0;
        for (int u = 0; u < p->nunits; u++) {
            const cp_unit *U = &p->units[u];
            if (U->nparams == 0) { n++; continue; } /* (a row of its own all the same) */
            for (int j = 0; j < U->nparams; j++) {
                if (j == 0 || cut[U->first_param + j]) n++;
                c->cell_of[U->first_param + j] = n - 1;
            }
        }
        free(cut);
        c->ncells = n > 0 ? n : 1;
    }
    size_t nc = (size_t)c->ncells;
    c->cell_rs = calloc(2 * nc, sizeof(int64_t));
    c->packs = calloc(nc * (size_t)M, 1);
    c->order = malloc(nc * (size_t)M * sizeof(int));
    c->pos = malloc(nc * (size_t)M * sizeof(int));
    c->pack_pos = malloc(nc * (size_t)M * sizeof(int));
    c->acc = malloc((size_t)We_max * (size_t)R * sizeof(float)); /* (expect_element: an experts unit's efsdp x R) */
    /* Blocks of CP_BLOCK floats: 4 of scratch, then expect_block's (every member's grads, a shard group's packed
     * values, the replicas' reduce-scatter values and partial sums, 3 more). */
    c->work_floats = ((size_t)We_max * (size_t)R + (size_t)We_max + 2 * (size_t)R + 7) * CP_BLOCK;
    c->work = malloc(c->work_floats * sizeof(float));
    if (!c->param_base || !c->members || !c->emembers || !c->expect || !c->packs || !c->order || !c->pos || !c->pack_pos || !c->acc ||
        !c->work || !c->cell_rs) {
        cp_checker_free(c);
        return -1;
    }
    /* Each unit's backwards in table order (a pipeline schedule runs the
     * micro-steps in its own order, and the grads accumulate in it) and
     * where the step reduces it: after every backward (FSDP2's default),
     * after the last (set_requires_gradient_sync(False) before the others),
     * as the plan's ops say. */
    for (size_t i = 0; i < nc * (size_t)M; i++) c->order[i] = c->pos[i] = c->pack_pos[i] = -1;
    {
        int *seen = calloc(nc, sizeof(int));
        if (!seen) { cp_checker_free(c); return -1; }
        /* Per cell of the op's part (the whole unit without one). */
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < p->nops; i++) {
                const cp_op *op = &p->ops[i];
                if (op->micro_step < 0 || op->micro_step >= M || op->unit < 0 || op->unit >= p->nunits) continue;
                if (cp_part_check(p, op->unit, op->part_first, op->part_count)) continue;
                const cp_unit *U = &p->units[op->unit];
                int j0 = op->part_count > 0 ? op->part_first : 0, j1 = op->part_count > 0 ? j0 + op->part_count
                                                                                         : U->nparams;
                for (int j = j0; j < j1; j++) {
                    int cell = c->cell_of[U->first_param + j];
                    if (j > j0 && cell == c->cell_of[U->first_param + j - 1]) continue; /* each cell once */
                    size_t row = (size_t)cell * (size_t)M;
                    if (op->kind == CP_OP_PACK) {
                        c->cell_rs[2 * (size_t)cell] = cp_part_offset(p, op->unit, op->part_first, op->part_count);
                        c->cell_rs[2 * (size_t)cell + 1] = cp_part_total(p, op->unit, op->part_first, op->part_count);
                    }
                    if (pass == 0) {
                        /* Each cell's backwards in table order (a pipeline schedule runs the
                         * micro-steps in its own order, and the grads accumulate in it) and
                         * where the step reduces it: after every backward (FSDP2's default),
                         * after the last (set_requires_gradient_sync(False) before the others),
                         * as the plan's ops say. */
                        int k = seen[cell];
                        if (op->kind == CP_OP_BACKWARD && k < M) {
                            c->order[row + (size_t)k] = op->micro_step;
                            c->pos[row + (size_t)op->micro_step] = k;
                            seen[cell] = k + 1;
                        } else if (k > 0) {
                            unsigned char *at = &c->packs[row + (size_t)(k - 1)];
                            if (op->kind == CP_OP_PACK) { *at |= 1; c->pack_pos[row + (size_t)op->micro_step] = k - 1; }
                            if (op->kind == CP_OP_PARTIAL_SAVE || op->kind == CP_OP_PARTIAL_ADD) *at |= 2;
                        }
                    } else if (seen[cell] <= 0) {
                        /* A cell whose table has no backward (hand-written tables): its
                         * micro-steps in order, packs where their labels say. */
                        for (int m = 0; m < M; m++) c->order[row + (size_t)m] = c->pos[row + (size_t)m] = m;
                        unsigned char *at = &c->packs[row + (size_t)op->micro_step];
                        if (op->kind == CP_OP_PACK) { *at |= 1; c->pack_pos[row + (size_t)op->micro_step] = op->micro_step; }
                        if (op->kind == CP_OP_PARTIAL_SAVE || op->kind == CP_OP_PARTIAL_ADD) *at |= 2;
                    }
                }
            }
        free(seen);
        /* A cell never packed: the unit's whole slot */
        for (int u = 0; u < p->nunits; u++)
            for (int j = 0; j < p->units[u].nparams; j++) {
                size_t cell = (size_t)c->cell_of[p->units[u].first_param + j];
                if (c->cell_rs[2 * cell + 1] == 0) c->cell_rs[2 * cell + 1] = p->units[u].total;
            }
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
    c->replicate_rank = rep_key;
    for (int q = 0; q < R; q++) {
        int rq = p->replicate_family >= 0 ? cp_group_member(p, p->replicate_family, rep_color, q) : rank;
        int sh_color = 0, sh_key = 0;
        if (p->shard_family >= 0) cp_group_of(p, p->shard_family, rq, &sh_color, &sh_key);
        for (int s = 0; s < W; s++)
            c->members[q * W + s] = p->shard_family >= 0 ? cp_group_member(p, p->shard_family, sh_color, s) : rq;
    }
    /* Expert parallelism's experts units (all share one efsdp and ep group):
     * their shard group's members, this rank's key there and in ep. */
    for (int u = 0; u < p->nunits; u++) {
        const cp_unit *U = &p->units[u];
        if (!U->expert) continue;
        int We = U->shard_size > 0 ? U->shard_size : 1;
        c->eshard_rank = cp_unit_shard_rank(p, u, rank);
        c->esplit_rank = cp_unit_split_rank(p, u, rank);
        for (int q = 0; q < R; q++) {
            int rq = p->replicate_family >= 0 ? cp_group_member(p, p->replicate_family, rep_color, q) : rank;
            int sh_color = 0, sh_key = 0;
            if (U->shard_family >= 0) cp_group_of(p, U->shard_family, rq, &sh_color, &sh_key);
            for (int s = 0; s < We; s++)
                c->emembers[q * We + s] = U->shard_family >= 0 ? cp_group_member(p, U->shard_family, sh_color, s) : rq;
        }
        break;
    }
    return 0;
}

int cp_checker_use_threads(cp_checker *c, int n)
{
    c->threads = 1;
    if (n < 2) return 0;
    if (!c->helper_work && !(c->helper_work = malloc(c->work_floats * sizeof(float)))) return -1;
    c->threads = 2;
    return 0;
}

void cp_checker_free(cp_checker *c)
{
    free(c->param_base);
    free(c->members);
    free(c->emembers);
    c->emembers = NULL;
    free(c->expect);
    free(c->packs);
    free(c->cell_of);
    free(c->cell_rs);
    c->cell_of = NULL;
    c->cell_rs = NULL;
    free(c->order);
    free(c->pos);
    free(c->pack_pos);
    free(c->acc);
    free(c->work);
    free(c->helper_work);
    c->work = NULL;
    c->helper_work = NULL;
    c->threads = 1;
    c->param_base = NULL;
    c->members = NULL;
    c->expect = NULL;
    c->packs = NULL;
    c->order = c->pos = c->pack_pos = NULL;
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
    cp_checker_fill_shards_of(c, u, U_SR(c, u), sharded);
}

void cp_checker_fill_shards_of(cp_checker *c, int u, int shard_rank, void *sharded)
{
    cp_checker_fill_shards_as(c, u, shard_rank, c->plan->units[u].orig_dtype, sharded);
}

void cp_checker_fill_shards_as(cp_checker *c, int u, int shard_rank, cp_dtype t, void *out)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    if (t == CP_U8) { /* a unit of mixed all-gather dtypes: each shard in its own at its byte offset */
        memset(out, 0, (size_t)U->ag_bytes);
        for (int j = 0; j < U->nparams; j++) {
            int param = U->first_param + j;
            const cp_param *prm = &p->params[param];
            int64_t valid = cp_param_valid(prm, shard_rank), k = cp_pattern_param_id(p, param), len;
            for (int64_t i = 0; i < valid; i += len) {
                int64_t e = shard_run(prm, U_W(c, u), shard_rank, U_TR(c, u), i, valid, &len);
                if (len > CP_BLOCK) len = CP_BLOCK;
                param_n(c->pattern, U->orig_dtype, k, c->param_base[param], e, len, c->step, c->work);
                cp_round_n(U->orig_dtype, c->work, len);
                cp_store_n(prm->ag_dtype, (char *)out + prm->ag_offset + (size_t)i * cp_dtype_size(prm->ag_dtype), len,
                           c->work);
            }
        }
        return;
    }
    size_t es = cp_dtype_size(t);
    float *v = c->work;
    int64_t done = 0; /* elements written so far: the gaps and padding between are zeros */
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        int64_t valid = cp_param_valid(prm, shard_rank), k = cp_pattern_param_id(p, param), len;
        if (prm->offset > done) memset((char *)out + (size_t)done * es, 0, (size_t)(prm->offset - done) * es);
        for (int64_t i = 0; i < valid; i += len) {
            int64_t e = shard_run(prm, U_W(c, u), shard_rank, U_TR(c, u), i, valid, &len);
            if (len > CP_BLOCK) len = CP_BLOCK;
            param_n(c->pattern, U->orig_dtype, k, c->param_base[param], e, len, c->step, v);
            if (t != U->orig_dtype) cp_round_n(U->orig_dtype, v, len); /* stored, then cast by the copy-in */
            cp_store_n(t, (char *)out + (size_t)(prm->offset + i) * es, len, v);
        }
        done = prm->offset + valid;
    }
    if (U->total > done) memset((char *)out + (size_t)done * es, 0, (size_t)(U->total - done) * es);
}

typedef struct {
    int u;
    const void *buf;
    void *mut;
    const char *when;
    int micro;
    int part_first, part_count; /* a part of the unit's parameters (cp_op's); 0, 0: all of them */
} unit_job;

static void check_unsharded_part(cp_checker *c, void *arg, int part, int nparts)
{
    const unit_job *jb = arg;
    int u = jb->u;
    const void *unsharded = jb->buf;
    const char *when = jb->when;
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    float *want = c->work, *got = c->work + CP_BLOCK;
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        cp_dtype ad = cp_param_ag_dtype(U, prm); /* (a unit of mixed all-gather dtypes: the parameter's own) */
        size_t es = cp_dtype_size(ad);
        const char *full = (const char *)unsharded + cp_param_unsharded_offset(U, prm, U_W(c, u));
        int64_t k = cp_pattern_param_id(p, param), len, lo, hi;
        part_range(prm->numel, part, nparts, &lo, &hi);
        for (int64_t i = lo; i < hi; i += len) {
            int64_t e = full_run(prm, U_TR(c, u), i, hi, &len);
            if (len > CP_BLOCK) len = CP_BLOCK;
            param_n(c->pattern, U->orig_dtype, k, c->param_base[param], e, len, c->step, want);
            cp_round_n(U->orig_dtype, want, len);
            cp_round_n(ad, want, len);
            cp_load_n(ad, full + (size_t)i * es, len, got);
            if (differ_n(want, got, len))
                for (int64_t q = 0; q < len; q++)
                    if (!same(want[q], got[q])) report(c, when, u, param, e + q, want[q], got[q]);
        }
    }
}

void cp_checker_check_unsharded(cp_checker *c, int u, const void *unsharded, const char *when)
{
    unit_job jb = { .u = u, .buf = unsharded, .when = when };
    cp_checker_in_parts(c, check_unsharded_part, &jb);
}

/* Rows are cells (c->cell_of: a unit's parameters whose grads are made and
 * reduced together; the whole unit but where a part cuts it). Positions k
 * are a cell's backwards in table order (c->order). Whether the k-th writes
 * the unsharded grads afresh: the step's first, or the first after a
 * packing (which freed them). */
static int fresh_at(const cp_checker *c, int row, int k)
{
    return k == 0 || (c->packs[(size_t)row * (size_t)c->plan->micro_steps + (size_t)(k - 1)] & 1);
}

/* The same for micro-step m's backward (the harness knows the op's micro-step). */
static int fresh_grads(const cp_checker *c, int row, int m)
{
    int k = c->pos[(size_t)row * (size_t)c->plan->micro_steps + (size_t)m];
    return k < 0 || fresh_at(c, row, k);
}

static int reduces_at(const cp_checker *c, int row, int k)
{
    return c->packs[(size_t)row * (size_t)c->plan->micro_steps + (size_t)k] & 1;
}

/* Whether the k-th backward's reduce-scatter output is parked in the partial
 * sums (all_reduce_last before the last micro-step) instead of all-reduced. */
static int parks_at(const cp_checker *c, int row, int k)
{
    return (c->packs[(size_t)row * (size_t)c->plan->micro_steps + (size_t)k] & 2) != 0;
}

/* The cell of parameter j of unit u. */
static int row_of(const cp_checker *c, int u, int j) { return c->cell_of[c->plan->units[u].first_param + j]; }

int cp_checker_grads_fresh(const cp_checker *c, int u, int micro)
{
    return cp_checker_grads_fresh_part(c, u, 0, 0, micro);
}

int cp_checker_grads_fresh_part(const cp_checker *c, int u, int part_first, int part_count, int micro)
{
    if (u < 0 || u >= c->plan->nunits || micro < 0 || micro >= c->plan->micro_steps) return 1;
    if (cp_part_check(c->plan, u, part_first, part_count)) return 1;
    int j0 = part_count > 0 ? part_first : 0, j1 = part_count > 0 ? part_first + part_count : c->plan->units[u].nparams;
    for (int j = j0; j < j1; j++)
        if (!fresh_grads(c, row_of(c, u, j), micro)) return 0;
    return 1;
}

/* The micro-step of a cell's k-th backward, -1 past its last. */
static int micro_at(const cp_checker *c, int row, int k)
{
    return c->order[(size_t)row * (size_t)c->plan->micro_steps + (size_t)k];
}

static void add_grads_part(cp_checker *c, void *arg, int part, int nparts)
{
    const unit_job *jb = arg;
    int u = jb->u, micro = jb->micro;
    void *grads = jb->mut;
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    size_t es = cp_dtype_size(U->grad_dtype);
    float *base = c->work, *gv = c->work + CP_BLOCK, *cur = c->work + 2 * CP_BLOCK;
    /* a part's backward: its parameters' grads only */
    int j0 = jb->part_count > 0 ? jb->part_first : 0;
    int j1 = jb->part_count > 0 ? jb->part_first + jb->part_count : U->nparams;
    for (int j = j0; j < j1; j++) {
        int param = U->first_param + j;
        if (p->params[param].frozen) continue; /* requires_grad=False: autograd makes no grad */
        int fresh = fresh_grads(c, row_of(c, u, j), micro);
        const cp_param *prm = &p->params[param];
        char *g = (char *)grads + (size_t)prm->grad_offset * es;
        int64_t k = cp_pattern_param_id(p, param), len, lo, hi;
        part_range(prm->numel, part, nparts, &lo, &hi);
        for (int64_t i = lo; i < hi; i += len) {
            int64_t e = full_run(prm, U_TR(c, u), i, hi, &len);
            if (len > CP_BLOCK) len = CP_BLOCK;
            /* The micro-step's grad, computed in ag_dtype, into the grads
             * buffer (grad_dtype) as autograd's AccumulateGrad does with
             * the unsharded parameter's grad_dtype (torch 2.15): cast to it,
             * then assigned afresh or added in it. */
            cp_dtype cd = cp_param_ag_dtype(U, prm); /* its compute dtype */
            if (c->pattern != CP_PATTERN_ORACLE) grad_base_n(cd, k, e, len, micro, c->step, base);
            grad_n(c->pattern, cd, k, e, len, c->rank, micro, c->step, base, gv);
            cp_round_n(cd, gv, len);
            cp_round_n(U->grad_dtype, gv, len);
            if (!fresh) {
                cp_load_n(U->grad_dtype, g + (size_t)i * es, len, cur);
                for (int64_t q = 0; q < len; q++) gv[q] = cur[q] + gv[q];
            }
            cp_store_n(U->grad_dtype, g + (size_t)i * es, len, gv);
        }
    }
}

void cp_checker_add_grads(cp_checker *c, int u, int micro, void *grads)
{
    cp_checker_add_grads_part(c, u, 0, 0, micro, grads);
}

void cp_checker_add_grads_part(cp_checker *c, int u, int part_first, int part_count, int micro, void *grads)
{
    if (cp_part_check(c->plan, u, part_first, part_count)) return;
    unit_job jb = { .u = u, .mut = grads, .micro = micro, .part_first = part_first, .part_count = part_count };
    cp_checker_in_parts(c, add_grads_part, &jb);
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
static float expect_element(const cp_checker *c, int u, cp_dtype cd, int row, int64_t k, int64_t e, int rs_key, int key)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    int W = U_W(c, u), R = p->replicate_size;
    float vals[W > 0 ? W : 1], rs[R > 0 ? R : 1], partial[R > 0 ? R : 1];
    float sharded = 0.0f;
    int have = 0, held = 0;
    for (int kk = 0; kk < p->micro_steps; kk++) {
        int m = micro_at(c, row, kk);
        if (m < 0) break;
        int fresh = fresh_at(c, row, kk);
        for (int i = 0; i < W * R; i++) {
            float g = round_to(cd, cp_pattern_grad(c->pattern, cd, k, e, U_MEM(c, u)[i], m, c->step));
            g = round_to(U->grad_dtype, g);
            c->acc[i] = round_to(U->grad_dtype, fresh ? g : c->acc[i] + g);
        }
        if (!reduces_at(c, row, kk)) continue;
        for (int q = 0; q < R; q++) {
            for (int s = 0; s < W; s++) vals[s] = packed(U, c->acc[q * W + s]);
            rs[q] = W > 1 ? cp_reduce_arith_pm(c->arith, U->reduce_dtype, U->rs_op, U->premul_factor, vals, W, rs_key)
                          : vals[0];
        }

        if (parks_at(c, row, kk)) {
            for (int q = 0; q < R; q++) partial[q] = held ? round_to(U->reduce_dtype, partial[q] + rs[q]) : rs[q];
            held = 1;
            continue;
        }
        if (held)
            for (int q = 0; q < R; q++) rs[q] = round_to(U->reduce_dtype, rs[q] + partial[q]);
        held = 0;
        if (c->solo)
            for (int q = 0; q < R; q++)
                if (q != c->replicate_rank) rs[q] = round_to(U->reduce_dtype, rs[c->replicate_rank] * (float)(q + 2));
        float v = R > 1 ? cp_reduce_arith(c->arith, U->reduce_dtype, U->ar_op, rs, R, key) : rs[0];
        if (U->post_divide != 1.0) v = round_to(U->reduce_dtype, (float)(v / U->post_divide));
        v = round_to(U->orig_dtype, v);
        sharded = have ? round_to(U->orig_dtype, sharded + v) : v;
        have = 1;
    }
    return sharded;
}

/* expect_element for the n <= CP_BLOCK elements e .. e+n-1 (one parameter's
 * consecutive elements under one pair of chains), into out: each member's
 * grads as a block, the reductions as blocks (cp_reduce_arith_f), the same
 * roundings in the same order, so the same bits. */
static void expect_block(const cp_checker *c, int u, cp_dtype cd, int row, int64_t k, int64_t e, int64_t n, int rs_key,
                         int key, float *out)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    int W = U_W(c, u), R = p->replicate_size;
    enum { B = CP_BLOCK };
    float *acc = c->work + 4 * B, *vals = acc + (size_t)W * R * B, *rs = vals + (size_t)W * B;
    float *partial = rs + (size_t)R * B, *base = partial + (size_t)R * B, *g = base + B, *v = g + B;
    const float *vp[W > R ? W : R];
    int have = 0, held = 0, q0 = c->replicate_rank;
    for (int kk = 0; kk < p->micro_steps; kk++) {
        int m = micro_at(c, row, kk);
        if (m < 0) break;
        int fresh = fresh_at(c, row, kk);
        if (c->pattern != CP_PATTERN_ORACLE) grad_base_n(cd, k, e, n, m, c->step, base);
        for (int i = 0; i < W * R; i++) {
            if (c->solo && i / W != q0) continue; /* the other replicas copy this one's */
            float *a = acc + (size_t)i * B;
            grad_n(c->pattern, cd, k, e, n, U_MEM(c, u)[i], m, c->step, base, g);
            cp_round_n(cd, g, n);
            cp_round_n(U->grad_dtype, g, n);
            if (fresh) memcpy(a, g, (size_t)n * sizeof *a);
            else for (int64_t j = 0; j < n; j++) a[j] += g[j];
            cp_round_n(U->grad_dtype, a, n);
        }
        if (!reduces_at(c, row, kk)) continue;
        for (int q = 0; q < R; q++) {
            if (c->solo && q != q0) continue;
            for (int sh = 0; sh < W; sh++) {
                float *x = vals + (size_t)sh * B;
                memcpy(x, acc + (size_t)(q * W + sh) * B, (size_t)n * sizeof *x);
                cp_round_n(U->reduce_dtype, x, n);
                if (U->pre_divide != 1.0) {
                    for (int64_t j = 0; j < n; j++) x[j] = (float)(x[j] / U->pre_divide);
                    cp_round_n(U->reduce_dtype, x, n);
                }
                vp[sh] = x;
            }
            float *r = rs + (size_t)q * B;
            if (W > 1) cp_reduce_arith_f_pm(c->arith, U->reduce_dtype, U->rs_op, U->premul_factor, vp, W, rs_key, n, r);
            else memcpy(r, vals, (size_t)n * sizeof *r);
        }
        if (parks_at(c, row, kk)) {
            for (int q = 0; q < R; q++) {
                if (c->solo && q != q0) continue;
                float *pq = partial + (size_t)q * B, *r = rs + (size_t)q * B;
                if (held) {
                    for (int64_t j = 0; j < n; j++) pq[j] += r[j];
                    cp_round_n(U->reduce_dtype, pq, n);
                } else memcpy(pq, r, (size_t)n * sizeof *pq);
            }
            held = 1;
            continue;
        }
        if (held)
            for (int q = 0; q < R; q++) {
                if (c->solo && q != q0) continue;
                float *pq = partial + (size_t)q * B, *r = rs + (size_t)q * B;
                for (int64_t j = 0; j < n; j++) r[j] += pq[j];
                cp_round_n(U->reduce_dtype, r, n);
            }
        held = 0;
        if (c->solo) /* the other replicas' stand-ins: this one's values times q + 2 (simulate.c) */
            for (int q = 0; q < R; q++) {
                if (q == q0) continue;
                float *r = rs + (size_t)q * B, f = (float)(q + 2);
                for (int64_t j = 0; j < n; j++) r[j] = rs[(size_t)q0 * B + (size_t)j] * f;
                cp_round_n(U->reduce_dtype, r, n);
            }
        if (R > 1) {
            for (int q = 0; q < R; q++) vp[q] = rs + (size_t)q * B;
            cp_reduce_arith_f(c->arith, U->reduce_dtype, U->ar_op, vp, R, key, n, v);
        } else memcpy(v, rs, (size_t)n * sizeof *v);
        if (U->post_divide != 1.0) {
            for (int64_t j = 0; j < n; j++) v[j] = (float)(v[j] / U->post_divide);
            cp_round_n(U->reduce_dtype, v, n);
        }
        cp_round_n(U->orig_dtype, v, n);
        if (have) {
            for (int64_t j = 0; j < n; j++) out[j] += v[j];
            cp_round_n(U->orig_dtype, out, n);
        } else memcpy(out, v, (size_t)n * sizeof *out);
        have = 1;
    }
    if (!have)
        for (int64_t j = 0; j < n; j++) out[j] = 0.0f;
}

/* Stand-in member `member` (a global rank of this rank's shard group)'s
 * reduce-scatter input for this rank's slot at micro-step `micro`, in the
 * reduce dtype, as the checker's model has it: its grads accumulated over
 * the micro-steps as expect_block does, packed (cast, pre-divide), zero
 * padding. A part (part_count > 0): its parameters only, its total
 * elements, offsets from its first parameter's. */
void cp_checker_member_packed(cp_checker *c, int u, int part_first, int part_count, const int *members, int nmembers,
                              int micro, void *const *out)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    size_t es = cp_dtype_size(U->reduce_dtype);
    enum { B = CP_BLOCK };
    float *base = c->work, *g = base + B, *acc = c->work + 4 * B; /* a block per member: expect_block's room */
    if (cp_part_check(p, u, part_first, part_count)) return;
    int64_t total = cp_part_total(p, u, part_first, part_count), at0 = cp_part_offset(p, u, part_first, part_count);
    int j0 = part_count > 0 ? part_first : 0, j1 = part_count > 0 ? part_first + part_count : U->nparams;
    int64_t done = 0; /* elements written so far: the gaps and padding between are zeros */
    for (int j = j0; j < j1; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        if (prm->frozen) continue; /* (packed without it: no gradient) */
        int64_t k = cp_pattern_param_id(p, param), valid = cp_param_valid(prm, U_SR(c, u)), len;
        int64_t off = cp_param_rs_offset(U, prm) - at0;
        int cell = row_of(c, u, j);
        if (off > done)
            for (int q = 0; q < nmembers; q++)
                memset((char *)out[q] + (size_t)done * es, 0, (size_t)(off - done) * es);
        done = off + valid;
        for (int64_t i = 0; i < valid; i += len) {
            int64_t e = shard_run(prm, U_W(c, u), U_SR(c, u), U_TR(c, u), i, valid, &len);
            if (len > CP_BLOCK) len = CP_BLOCK;
            /* the backwards up to the one this pack follows, in table order */
            size_t row = (size_t)cell * (size_t)p->micro_steps;
            int last = micro >= 0 && micro < p->micro_steps ? c->pack_pos[row + (size_t)micro] : -1;
            if (last < 0 && micro >= 0 && micro < p->micro_steps) last = c->pos[row + (size_t)micro];
            for (int kk = 0; kk <= last; kk++) {
                int m = micro_at(c, cell, kk);
                int fresh = fresh_at(c, cell, kk);
                /* one hash per element, shared by every member (their grads differ by the rank factor) */
                cp_dtype cd = cp_param_ag_dtype(U, prm);
                if (c->pattern != CP_PATTERN_ORACLE) grad_base_n(cd, k, e, len, m, c->step, base);
                for (int q = 0; q < nmembers; q++) {
                    float *a = acc + (size_t)q * B;
                    grad_n(c->pattern, cd, k, e, len, members[q], m, c->step, base, g);
                    cp_round_n(cd, g, len);
                    cp_round_n(U->grad_dtype, g, len);
                    if (fresh) memcpy(a, g, (size_t)len * sizeof *a);
                    else for (int64_t x = 0; x < len; x++) a[x] += g[x];
                    cp_round_n(U->grad_dtype, a, len);
                }
            }
            for (int q = 0; q < nmembers; q++) {
                float *a = acc + (size_t)q * B;
                cp_round_n(U->reduce_dtype, a, len);
                if (U->pre_divide != 1.0) {
                    for (int64_t x = 0; x < len; x++) a[x] = (float)(a[x] / U->pre_divide);
                    cp_round_n(U->reduce_dtype, a, len);
                }
                cp_store_n(U->reduce_dtype, (char *)out[q] + (size_t)(off + i) * es, len, a);
            }
        }
    }
    if (total > done)
        for (int q = 0; q < nmembers; q++)
            memset((char *)out[q] + (size_t)done * es, 0, (size_t)(total - done) * es);
}

/* Every reduced grad element of unit u as this rank must hold it (padding
 * is not written): each parameter's shard in runs of consecutive elements
 * that share their chains (the keys change only at chunk boundaries). */
static void expect_unit_part(cp_checker *c, void *arg, int part, int nparts)
{
    const unit_job *jb = arg;
    int u = jb->u;
    float *out = jb->mut;
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    int R = p->replicate_size;
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        if (prm->frozen) continue; /* never reduced */
        int64_t k = cp_pattern_param_id(p, param);
        int64_t valid = cp_param_valid(prm, U_SR(c, u)), len, lo, hi;
        /* the chains are its reduction's: positions in its part's buffer (the unit's slot without one) */
        int row = row_of(c, u, j);
        int64_t base = c->cell_rs[2 * (size_t)row], total = c->cell_rs[2 * (size_t)row + 1];
        part_range(valid, part, nparts, &lo, &hi);
        for (int64_t i = lo; i < hi; i += len) {
            int64_t e = shard_run(prm, U_W(c, u), U_SR(c, u), U_TR(c, u), i, hi, &len);
            int64_t at = cp_param_rs_offset(U, prm) - base + i, rs_end, ar_end;
            int rs_key = cp_reduce_scatter_key_run(c->arith, U->reduce_dtype, U_SR(c, u), at, total, U_W(c, u), &rs_end);
            int key = cp_all_reduce_key_run(c->arith, U->reduce_dtype, at, total, R, &ar_end);
            if (rs_end - at < len) len = rs_end - at;
            if (ar_end - at < len) len = ar_end - at;
            if (len > CP_BLOCK) len = CP_BLOCK;
            expect_block(c, u, cp_param_ag_dtype(U, prm), row, k, e, len, rs_key, key, out + prm->offset + i);
        }
    }
}

static void expect_unit(cp_checker *c, int u, float *out)
{
    unit_job jb = { .u = u, .mut = out };
    cp_checker_in_parts(c, expect_unit_part, &jb);
}

/* NCCL's ring all-reduce finishes element `at` of the unit's buffer on a ring
 * position that depends on its channel and chunk split, NCCL's run-time
 * choice: got may be the bits of any position that split can give it
 * (0 .. cp_nccl_all_reduce_max_key: the first 16 bytes always finish on
 * position 0), each position's value worked out in full; no other. */
static int any_ring_order(const cp_checker *c, int u, cp_dtype cd, int row, int64_t k, int64_t e, int64_t at, float got)
{
    int R = c->plan->replicate_size;
    if (c->arith != CP_ARITH_NCCL || R < 2) return 0;
    int last = cp_nccl_all_reduce_max_key(c->plan->units[u].reduce_dtype, at, R);
    for (int key = 0; key <= last; key++)
        if (same(expect_element(c, u, cd, row, k, e, U_SR(c, u), key), got)) return 1;
    return 0;
}

static void compare_grads(cp_checker *c, int u, const float *want, const void *sharded_grads)
{
    const cp_plan *p = c->plan;
    const cp_unit *U = &p->units[u];
    size_t es = cp_dtype_size(U->orig_dtype);
    float *got = c->work, *w = c->work + CP_BLOCK;
    for (int j = 0; j < U->nparams; j++) {
        int param = U->first_param + j;
        const cp_param *prm = &p->params[param];
        if (prm->frozen) continue; /* no sharded grad */
        int64_t valid = cp_param_valid(prm, U_SR(c, u)), at = cp_param_rs_offset(U, prm);
        for (int64_t i0 = 0; i0 < prm->padded; i0 += CP_BLOCK) {
            int64_t n = prm->padded - i0 < CP_BLOCK ? prm->padded - i0 : CP_BLOCK;
            cp_load_n(U->orig_dtype, (const char *)sharded_grads + (size_t)(at + i0) * es, n, got);
            for (int64_t q = 0; q < n; q++) w[q] = i0 + q < valid ? want[prm->offset + i0 + q] : 0.0f;
            int bad = differ_n(w, got, n);
            for (int64_t q = 0; q < n && bad; q++) {
                int64_t i = i0 + q;
                if (same(w[q], got[q])) continue;
                int64_t e = cp_param_full_index(prm, U_TR(c, u),
                                                cp_param_global_index(prm, U_W(c, u), U_SR(c, u), i));
                int row = row_of(c, u, j);
                if (i < valid && any_ring_order(c, u, cp_param_ag_dtype(U, prm), row, cp_pattern_param_id(p, param), e,
                                                at - c->cell_rs[2 * (size_t)row] + i, got[q]))
                    continue;
                report(c, i < valid ? "reduced sharded grad" : "grad padding", u, param, i < valid ? e : -1, w[q],
                       got[q]);
            }
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

/* Whether all n bytes are zero (+0.0 in every dtype). */
CP_HOT static int zero_bytes(const char *restrict p, size_t n)
{
    unsigned char acc = 0;
    for (size_t i = 0; i < n; i++) acc |= (unsigned char)p[i];
    return acc == 0;
}

/* act_gathered / act_summand over positions pos0 .. pos0+n-1 (n <= CP_BLOCK). */
CP_HOT static void act_hash_n(uint32_t *restrict h, int64_t op_index, int64_t pos0, int64_t n, int step)
{
    uint64_t salt = ((uint64_t)op_index << 40) ^ (uint64_t)step;
    CP_LOOP(n, h[j] = mix32(salt ^ ((uint64_t)(pos0 + j) << 4)));
}

CP_HOT static void act_sum_values(float *restrict out, const uint32_t *restrict h, int64_t n, float r)
{
    CP_LOOP(n, out[j] = (float)(int32_t)(h[j] % 3u + 1u) + r);
}

CP_HOT static void act_gather_bits(uint16_t *restrict b, const uint32_t *restrict h, int64_t n, uint32_t exp)
{
    CP_LOOP(n, uint32_t x = (uint16_t)h[j]; b[j] = (uint16_t)((x & exp) == exp ? x & ~0x4000u : x));
}

static void act_values_n(cp_dtype t, int gather, int64_t op_index, int64_t pos0, int64_t n, int step, int tp_rank,
                         float *out)
{
    uint32_t h[CP_BLOCK];
    act_hash_n(h, op_index, pos0, n, step);
    if (!gather) act_sum_values(out, h, n, (float)(tp_rank % 2));
    else if (t == CP_FP32)
        for (int64_t j = 0; j < n; j++) out[j] = (float)(h[j] % 2000000u) - 1000000.0f;
    else {
        uint16_t b[CP_BLOCK];
        act_gather_bits(b, h, n, t == CP_BF16 ? 0x7f80u : 0x7c00u);
        cp_load_n(t, b, n, out);
    }
}

static void act_input_range(cp_checker *c, const cp_op *op, int tp_rank, int64_t first, int64_t len, void *out);

static void act_input_part(cp_checker *c, void *arg, int part, int nparts)
{
    const act_job *jb = arg;
    int64_t lo, hi;
    part_range(jb->len, part, nparts, &lo, &hi);
    act_input_range(c, jb->op, jb->tp_rank, jb->first + lo, hi - lo,
                    (char *)jb->in + (size_t)lo * cp_dtype_size(jb->op->dtype));
}

void cp_checker_act_input_part(cp_checker *c, const cp_op *op, int tp_rank, int tp_size, int64_t first, int64_t len,
                               void *out)
{
    act_job jb = { .op = op, .tp_rank = tp_rank, .tp_size = tp_size, .in = out, .first = first, .len = len };
    cp_checker_in_parts(c, act_input_part, &jb);
}

static void act_input_range(cp_checker *c, const cp_op *op, int tp_rank, int64_t first, int64_t len, void *out)
{
    int64_t seq = op - c->plan->ops, n = op->count;
    int gather = op->kind == CP_OP_TP_ALL_GATHER;
    size_t es = cp_dtype_size(op->dtype);
    float v[CP_BLOCK];
    for (int64_t i = 0; i < len; i += CP_BLOCK) {
        int64_t m = len - i < CP_BLOCK ? len - i : CP_BLOCK;
        /* a gather's input is its slot of the whole: positions tp_rank * n + i */
        act_values_n(op->dtype, gather, seq, (gather ? (int64_t)tp_rank * n : 0) + first + i, m, c->step, tp_rank, v);
        cp_store_n(op->dtype, (char *)out + (size_t)i * es, m, v);
    }
}

void cp_checker_act_input(cp_checker *c, const cp_op *op, int tp_rank, int tp_size, void *in)
{
    int64_t n = op->count;
    int64_t len = op->kind == CP_OP_TP_REDUCE_SCATTER ? n * tp_size : n;
    if (c->solo && op->kind == CP_OP_TP_REDUCE_SCATTER) {
        /* --ranks: only this rank's slot of its input is summed here (the
         * others go to stand-in peers, whose outputs nobody checks): zeros */
        size_t es = cp_dtype_size(op->dtype);
        memset(in, 0, (size_t)len * es);
        cp_checker_act_input_part(c, op, tp_rank, tp_size, (int64_t)tp_rank * n, n, (char *)in + (size_t)tp_rank * n * es);
        return;
    }
    cp_checker_act_input_part(c, op, tp_rank, tp_size, 0, len, in);
}

static void act_output_part(cp_checker *c, void *arg, int part, int nparts)
{
    const act_job *jb = arg;
    const cp_op *op = jb->op;
    int tp_rank = jb->tp_rank, tp_size = jb->tp_size;
    const void *out = jb->out;
    int64_t seq = op - c->plan->ops;
    int64_t n = op->count;
    int gather = op->kind == CP_OP_TP_ALL_GATHER;
    int64_t len = gather ? n * tp_size : n, base = op->kind == CP_OP_TP_REDUCE_SCATTER ? (int64_t)tp_rank * n : 0;
    size_t es = cp_dtype_size(op->dtype);
    float want[CP_BLOCK], got[CP_BLOCK], v[CP_BLOCK];
    int64_t i0, lo;
    part_range(len, part, nparts, &lo, &len);
    i0 = lo;
    /* Whole blocks first: the expected values as blocks (a gather's position
     * is its index; a sum's, base + index, summed over the TP ranks in rank
     * order), compared at once; a block that differs, and MAX, element by
     * element below. */
    for (; op->reduce_op != CP_MAX && i0 < len; i0 += CP_BLOCK) {
        int64_t m = len - i0 < CP_BLOCK ? len - i0 : CP_BLOCK;
        int peer = gather && c->solo && (i0 + m <= (int64_t)tp_rank * n || i0 >= (int64_t)(tp_rank + 1) * n);
        if (peer && zero_bytes((const char *)out + (size_t)i0 * es, (size_t)m * es)) continue;
        if (peer) memset(want, 0, (size_t)m * sizeof *want); /* a stand-in peer's slot: zeros */
        else if (gather) act_values_n(op->dtype, 1, seq, i0, m, c->step, 0, want);
        else
            for (int r = 0; r < tp_size; r++) {
                if (c->solo && r != tp_rank) memset(v, 0, (size_t)m * sizeof *v);
                else act_values_n(op->dtype, 0, seq, base + i0, m, c->step, r, v);
                for (int64_t j = 0; j < m; j++) want[j] = r == 0 ? 0.0f + v[j] : want[j] + v[j];
            }
        cp_load_n(op->dtype, (const char *)out + (size_t)i0 * es, m, got);
        if (differ_n(want, got, m)) break;
    }
    for (int64_t i = i0; i < len; i++) {
        float want = 0.0f;
        /* --ranks: a stand-in TP peer's input is zeros (simulate.c) */
#define SUMMAND(r) (c->solo && (r) != tp_rank ? 0.0f : act_summand(seq, base + i, c->step, (r)))
        if (gather) want = c->solo && i / n != tp_rank ? 0.0f : act_gathered(op->dtype, seq, i, c->step);
        else if (op->reduce_op == CP_MAX) /* loss_parallel's per-token max */
            for (int r = 0; r < tp_size; r++) want = r == 0 ? SUMMAND(r) : fmaxf(want, SUMMAND(r));
        else
            for (int r = 0; r < tp_size; r++) want += SUMMAND(r);
#undef SUMMAND
        float got = cp_load(op->dtype, out, i);
        if (!same(want, got) && c->mismatches++ == 0)
            fprintf(stderr, "commplan: mismatch: rank %d step %d unit %s op %ld (%s) element %ld: expected %.9g, got "
                    "%.9g\n", c->rank, c->step, c->plan->units[op->unit].name, (long)seq, cp_op_kind_name(op->kind),
                    (long)i, (double)want, (double)got);
    }
}

int cp_checker_act_group(cp_checker *c, const cp_op *op, int *key, int *size)
{
    const cp_plan *p = c->plan;
    const char *name = op->family >= 0 && op->family < p->nfamilies ? p->families[op->family].name : NULL;
    if (name && (strcmp(name, "tp") == 0 || strcmp(name, "cp") == 0)) {
        *key = cp_op_group_key(p, op, c->rank);
        *size = cp_op_group_size(p, op);
        return 0;
    }
    if (c->mismatches++ == 0)
        fprintf(stderr, "commplan: mismatch: rank %d step %d unit %s op %ld (%s): an activation collective on %s%s, "
                "not the tp or cp group\n", c->rank, c->step, p->units[op->unit].name, (long)(op - p->ops),
                cp_op_kind_name(op->kind), name ? "group " : "", name ? name : "no group (issued locally)");
    return -1;
}

void cp_checker_act_output(cp_checker *c, const cp_op *op, int tp_rank, int tp_size, const void *out)
{
    act_job jb = { .op = op, .tp_rank = tp_rank, .tp_size = tp_size, .out = out };
    cp_checker_in_parts(c, act_output_part, &jb);
}

/* ---- pipeline messages ----
 * The compute that produces an activation (or its gradient) is a
 * placeholder as well: the sender writes a hash of (its global rank, the
 * tag, the micro-step, the step, the element) into the message, in the
 * op's dtype and never zero (a zeroed or poisoned slot never passes); the
 * receiver expects exactly those bits. */
static uint16_t p2p_bits16(uint32_t h, cp_dtype t)
{
    uint16_t b = (uint16_t)h;
    uint16_t exp = t == CP_BF16 ? 0x7f80u : 0x7c00u;
    if ((b & exp) == exp) b &= (uint16_t)~0x4000u; /* finite */
    if ((b & 0x7fffu) == 0) b |= t == CP_BF16 ? 0x3f80u : 0x3c00u; /* +-0 -> +-1 */
    return b;
}

static uint32_t p2p_hash(int sender, int tag, int micro, int step, int64_t i)
{
    return mix32(((uint64_t)(uint32_t)sender << 44) ^ ((uint64_t)(uint32_t)tag << 28) ^
                 ((uint64_t)(uint32_t)micro << 12) ^ (uint64_t)(uint32_t)step ^ ((uint64_t)i * 0x9e3779b97f4a7c15ULL));
}

/* Element i of the message as the dtype's bits (fp32: an integer 1 .. 2^21, exact). */
static void p2p_element(const cp_checker *c, const cp_op *op, int sender, int64_t i, void *out)
{
    uint32_t h = p2p_hash(sender, op->tag, op->micro_step, c->step, i);
    if (op->dtype == CP_FP32) {
        float v = (float)(h % 2097152u + 1u);
        memcpy(out, &v, sizeof v);
        return;
    }
    uint16_t b = p2p_bits16(h, op->dtype);
    memcpy(out, &b, sizeof b);
}

void cp_checker_p2p_message(const cp_checker *c, const cp_op *op, int sender, void *out)
{
    size_t es = cp_dtype_size(op->dtype);
    for (int64_t i = 0; i < op->count; i++) p2p_element(c, op, sender, i, (char *)out + (size_t)i * es);
}

int cp_checker_p2p_check(cp_checker *c, const cp_op *op, int sender, const void *got)
{
    size_t es = cp_dtype_size(op->dtype);
    unsigned char want[4];
    for (int64_t i = 0; i < op->count; i++) {
        const char *at = (const char *)got + (size_t)i * es;
        p2p_element(c, op, sender, i, want);
        if (memcmp(want, at, es) == 0) continue;
        if (c->mismatches++ == 0)
            fprintf(stderr, "commplan: mismatch: rank %d step %d: message tag %d micro-step %d from rank %d (%s of unit "
                    "%s, op %ld) element %ld: expected %.9g, got %.9g\n", c->rank, c->step, op->tag, op->micro_step,
                    sender, cp_op_kind_name(op->kind), c->plan->units[op->unit].name, (long)(op - c->plan->ops),
                    (long)i, (double)cp_load(op->dtype, want, 0), (double)cp_load(op->dtype, at, 0));
        return -1;
    }
    return 0;
}

/* ---- expert parallelism: routed counts and token rows ---- */

static uint32_t a2a_key(int rank, int step, const cp_op *op, uint32_t salt)
{
    return mix32(((uint64_t)(uint32_t)rank << 40) ^ ((uint64_t)(uint32_t)step << 24) ^
                 ((uint64_t)(uint32_t)op->micro_step << 12) ^ ((uint64_t)(uint32_t)op->a2a_slot << 4) ^
                 ((uint64_t)(uint32_t)op->unit * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)salt << 52));
}

/* Rows go expert by expert, each to a random expert among those this draw
 * routes to (about three in four; the others get none); an expert whose
 * member is full passes its row to the next with room. One draw in four
 * fills one member exactly to capacity first and leaves the next with
 * nothing. Rows past every member's capacity are dropped (never refused). */
void cp_checker_a2a_counts(const cp_checker *c, const cp_op *op, int rank, int n, int64_t *counts)
{
    int epp = op->a2a_experts, E = n * epp;
    int64_t cap = op->a2a_capacity, rows = op->a2a_rows > 0 ? op->a2a_rows : (int64_t)n * cap / 2;
    int64_t *load = calloc((size_t)n, sizeof *load);
    unsigned char *on = calloc((size_t)E, 1);
    for (int e = 0; e < E; e++) counts[e] = 0;
    if (!load || !on || E == 0) goto done;
    uint32_t h = a2a_key(rank, c->step, op, 1);
    int full = -1, empty = -1;
    if (h % 4 == 0) {
        full = (int)((h >> 2) % (uint32_t)n);
        empty = n > 1 ? (full + 1) % n : -1;
    }
    int any = 0;
    for (int e = 0; e < E; e++) {
        on[e] = e / epp != empty && mix32(((uint64_t)h << 20) ^ (uint64_t)e) % 4 != 0;
        any |= on[e];
    }
    for (int e = 0; e < E && !any; e++) on[e] = e / epp != empty, any |= on[e];
    if (!any) goto done;
    int64_t left = rows;
    if (full >= 0) { /* exactly capacity (or every row) to member `full`, spread over its experts */
        int64_t give = cap < left ? cap : left;
        for (int64_t i = 0; i < give; i++) counts[full * epp + (int)(mix32(((uint64_t)h << 32) ^ (uint64_t)i) % (uint32_t)epp)]++;
        load[full] = give;
        left -= give;
    }
    for (int64_t i = 0; i < left; i++) {
        int e = (int)(mix32(((uint64_t)h << 24) ^ ((uint64_t)i * 0x9e3779b97f4a7c15ULL)) % (uint32_t)E), k = 0;
        while (k < E && (!on[e] || load[e / epp] >= cap)) e = (e + 1) % E, k++;
        for (k = k < E ? k : 0; k < E && (e / epp == empty || load[e / epp] >= cap); k++) e = (e + 1) % E;
        if (k == E) break; /* every member that takes rows is full */
        counts[e]++;
        load[e / epp]++;
    }
done:
    free(load);
    free(on);
    /* COMMPLAN_A2A_FULL=<rank>: that rank routes its rows member after member, each exactly to capacity until the
     * rows run out (the largest counts the plan admits, deterministically; a test of the capacity's rounding). */
    const char *fill = getenv("COMMPLAN_A2A_FULL");
    if (fill && fill[0] && atoi(fill) == rank && E > 0) {
        int64_t left = rows;
        for (int e = 0; e < E; e++) counts[e] = 0;
        for (int m = 0; m < n && left > 0; m++) {
            int64_t give = cap < left ? cap : left;
            for (int64_t i = 0; i < give; i++) counts[m * epp + (int)(i % epp)]++;
            left -= give;
        }
    }
    /* COMMPLAN_A2A_OVERFLOW=<rank>: that rank routes one row past the next member's capacity (a test of the refusal). */
    const char *over = getenv("COMMPLAN_A2A_OVERFLOW");
    if (over && over[0] && atoi(over) == rank && E > 0) {
        int m = 1 % n;
        for (int e = 0; e < epp; e++) counts[m * epp + e] = 0;
        counts[m * epp] = cap + 1;
    }
}

static void a2a_element(const cp_checker *c, const cp_op *op, int sender, int receiver, int expert, int64_t row,
                        int64_t i, void *out)
{
    uint32_t h = mix32(((uint64_t)a2a_key(sender, c->step, op, 2 + (uint32_t)op->a2a_combine) << 32) ^
                       ((uint64_t)(uint32_t)receiver << 20) ^ (uint64_t)(uint32_t)expert) ^
                 mix32(((uint64_t)row << 24) ^ (uint64_t)i ^ 0x5bd1e995u);
    if (op->dtype == CP_FP32) {
        float v = (float)(h % 2097152u + 1u);
        memcpy(out, &v, sizeof v);
        return;
    }
    uint16_t b = p2p_bits16(h, op->dtype);
    memcpy(out, &b, sizeof b);
}

void cp_checker_a2a_row(const cp_checker *c, const cp_op *op, int sender, int receiver, int expert, int64_t row,
                        void *out)
{
    size_t es = cp_dtype_size(op->dtype);
    for (int64_t i = 0; i < op->a2a_dim; i++) a2a_element(c, op, sender, receiver, expert, row, i, (char *)out + (size_t)i * es);
}

int cp_checker_a2a_check_row(cp_checker *c, const cp_op *op, int sender, int receiver, int expert, int64_t row,
                             int64_t at, const void *got)
{
    size_t es = cp_dtype_size(op->dtype);
    unsigned char want[4];
    for (int64_t i = 0; i < op->a2a_dim; i++) {
        const char *g = (const char *)got + (size_t)i * es;
        a2a_element(c, op, sender, receiver, expert, row, i, want);
        if (memcmp(want, g, es) == 0) continue;
        if (c->mismatches++ == 0)
            fprintf(stderr, "commplan: mismatch: rank %d step %d: %s (%s) of unit %s, micro-step %d (op %ld): row %ld "
                    "(received row %ld) of expert %d from rank %d, element %ld: expected %.9g, got %.9g\n", c->rank,
                    c->step, cp_op_kind_name(op->kind), op->a2a_combine ? "combine" : "dispatch",
                    c->plan->units[op->unit].name, op->micro_step, (long)(op - c->plan->ops), (long)row, (long)at,
                    expert, sender, (long)i, (double)cp_load(op->dtype, want, 0), (double)cp_load(op->dtype, g, 0));
        return -1;
    }
    return 0;
}
