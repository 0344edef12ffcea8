/* Expert parallelism through the GPU library, as a MoE training loop drives
 * it: cp_gpu_unshard / _reshard / _reduce_grads and cp_gpu_exchange_tokens
 * in the plan's order (SCHEDULE.md), every rank, with the caller's side of
 * each exchange done for real and checked byte for byte:
 *   forward   counts per expert drawn from (rank, step, micro-step, unit),
 *             cp_gpu_set_expert_counts, rows written into the send buffer
 *             (each byte a hash of sender, expert, row, byte, direction),
 *             exchange: every received row checked against its sender's
 *             draw, the experts' "output" (each byte xor a per-expert key)
 *             written over them, exchange: the send buffer must hold the
 *             rows sent, xor their expert's key;
 *   backward  the same with the gradient rows (another hash), split by
 *             that micro-step's forward counts.
 * cp_gpu_exchange_counts must give the drawn counts, sent and received.
 * The caller's forward and backward of each unit write its gradients
 * (cudaMemsetAsync on the caller's stream). Built against the emulator
 * (make emu-build: race detector) and against a real plan's library
 * (build/<plan>/ep_library on a GPU); launched like the plan's binary.
 * Exit 0 with one line per rank, 1 on a mismatch, a refused call or a
 * plan without token exchanges (nothing checked), 2 on a setup failure.
 * Usage: ep_library [steps] (1 to 1000, default 2) */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp_gpu.h"

extern const cp_plan CP_PLAN;
extern const cp_gpu_kernels CP_KERNELS;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* Global rank r's tokens per global expert for op `counts` (an A2A_COUNTS)
 * in step `step`: each member's share within the op's capacity, some
 * experts empty, one member's share at the capacity now and then. */
static void draw_counts(const cp_plan *p, const cp_op *counts, int r, int step, int64_t *out)
{
    int n = p->families[counts->family].size, epp = counts->a2a_experts;
    int64_t cap = counts->a2a_capacity;
    for (int m = 0; m < n; m++) {
        uint64_t h = mix64(((uint64_t)r << 40) ^ ((uint64_t)step << 32) ^ ((uint64_t)counts->micro_step << 24) ^
                           ((uint64_t)counts->unit << 8) ^ (uint64_t)m);
        int64_t left = (h & 7) == 0 ? cap : cap * (int64_t)(h % 100) / 100;
        for (int e = 0; e < epp; e++) {
            int64_t c = e == epp - 1 ? left : (int64_t)(mix64(h + (uint64_t)e) % (uint64_t)(left + 1));
            if ((mix64(h ^ (uint64_t)e) & 3) == 0) c = 0;
            out[m * epp + e] = c;
            left -= c;
        }
    }
}

/* Byte b of row j of sender s's rows for global expert e (dir 0 tokens, 1 gradients). */
static unsigned char row_byte(int s, int step, int micro, int unit, int e, int64_t j, size_t b, int dir)
{
    return (unsigned char)mix64(((uint64_t)s << 48) ^ ((uint64_t)step << 40) ^ ((uint64_t)micro << 34) ^
                                ((uint64_t)unit << 24) ^ ((uint64_t)e << 12) ^ (uint64_t)dir ^
                                ((uint64_t)j * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)b << 1) * 0x2545f491ULL);
}

static unsigned char expert_key(int e) { return (unsigned char)(0xa5 ^ (e * 37)); }

typedef struct {
    cp_gpu *g;
    const cp_plan *p;
    cudaStream_t s;
    int rank, step, bad;
    unsigned char *host; /* a token buffer's bytes */
    int64_t *counts, *peer;
    int *pairs; /* per unit: dispatch-direction exchanges so far in the step */
    size_t host_bytes;
} run_ctx;

static int fail_at(run_ctx *c, const cp_op *op, const char *what)
{
    fprintf(stderr, "commplan: ep library run of %s: rank %d step %d micro-step %d unit %s: %s\n", c->p->name, c->rank,
            c->step, op->micro_step, c->p->units[op->unit].name, what);
    c->bad = 1;
    return -1;
}

/* The unit's A2A_COUNTS of this micro-step (the op the exchange splits by). */
static const cp_op *counts_op(const cp_plan *p, const cp_op *op)
{
    if (op->kind == CP_OP_A2A_COUNTS) return op;
    return op->a2a_counts_op >= 0 && op->a2a_counts_op < p->nops ? &p->ops[op->a2a_counts_op] : NULL;
}

/* Writes this rank's rows into the buffer an exchange sends from: the send
 * buffer for a dispatch-direction exchange (packed by member, then expert),
 * or, before a combine-direction one, checks the rows received and writes
 * the experts' output over them. The rows' bytes differ per exchange pair
 * of the unit in the step (forward, backward, each micro-step). */
static int exchange(run_ctx *c, const cp_op *op, const cp_op *a2a)
{
    const cp_plan *p = c->p;
    const cp_op *k = counts_op(p, a2a);
    if (!k) return fail_at(c, op, "the exchange names no counts op");
    int n = p->families[k->family].size, epp = k->a2a_experts, E = n * epp, color, key;
    cp_group_of(p, k->family, c->rank, &color, &key);
    size_t row = (size_t)k->a2a_dim * cp_dtype_size(a2a->dtype);
    int micro = k->micro_step, u = op->unit;
    int dir = a2a->a2a_combine ? c->pairs[u] : ++c->pairs[u];
    void *send = cp_gpu_tokens(c->g, u, 0), *recv = cp_gpu_tokens(c->g, u, 1);
    if (!send || !recv) return fail_at(c, op, "cp_gpu_tokens returned NULL");
    draw_counts(p, k, c->rank, c->step, c->counts);
    if (!a2a->a2a_combine) { /* this rank's rows out: sorted by destination member, then expert */
        size_t at = 0;
        for (int e = 0; e < E; e++)
            for (int64_t j = 0; j < c->counts[e]; j++, at += row)
                for (size_t b = 0; b < row; b++) c->host[at + b] = row_byte(c->rank, c->step, micro, u, e, j, b, dir);
        if (op->kind == CP_OP_A2A_COUNTS && cp_gpu_set_expert_counts(c->g, u, c->counts, E))
            return fail_at(c, op, cp_gpu_last_error(c->g));
        if (at && cudaMemcpyAsync(send, c->host, at, cudaMemcpyHostToDevice, c->s) != cudaSuccess)
            return fail_at(c, op, "cudaMemcpyAsync of the send rows failed");
        if (cp_gpu_exchange_tokens(c->g, u, c->s)) return fail_at(c, op, cp_gpu_last_error(c->g));
        /* Every received row is its sender's, in (member, local expert) order. */
        const int64_t *got = cp_gpu_exchange_counts(c->g, u);
        if (!got) return fail_at(c, op, "cp_gpu_exchange_counts returned NULL after an exchange");
        for (int e = 0; e < E; e++)
            if (got[e] != c->counts[e]) return fail_at(c, op, "cp_gpu_exchange_counts: the sent counts differ");
        size_t total = 0;
        for (int m = 0; m < n; m++) {
            draw_counts(p, k, cp_group_member(p, k->family, color, m), c->step, c->peer);
            for (int le = 0; le < epp; le++) {
                if (got[E + m * epp + le] != c->peer[key * epp + le])
                    return fail_at(c, op, "cp_gpu_exchange_counts: the received counts differ from the senders'");
                total += (size_t)c->peer[key * epp + le] * row;
            }
        }
        if (cudaStreamSynchronize(c->s) != cudaSuccess ||
            (total && cudaMemcpy(c->host, recv, total, cudaMemcpyDeviceToHost) != cudaSuccess))
            return fail_at(c, op, "reading the received rows failed");
        size_t at2 = 0;
        for (int m = 0; m < n; m++) {
            int s = cp_group_member(p, k->family, color, m);
            draw_counts(p, k, s, c->step, c->peer);
            for (int le = 0; le < epp; le++) {
                int e = key * epp + le;
                for (int64_t j = 0; j < c->peer[e]; j++, at2 += row)
                    for (size_t b = 0; b < row; b++) {
                        unsigned char want = row_byte(s, c->step, micro, u, e, j, b, dir);
                        if (c->host[at2 + b] != want) {
                            char m2[200];
                            snprintf(m2, sizeof m2, "row %lld of expert %d from rank %d, byte %zu: %u, want %u",
                                     (long long)j, e, s, b, c->host[at2 + b], want);
                            return fail_at(c, op, m2);
                        }
                        c->host[at2 + b] ^= expert_key(e); /* the experts' work */
                    }
            }
        }
        if (total && cudaMemcpyAsync(recv, c->host, total, cudaMemcpyHostToDevice, c->s) != cudaSuccess)
            return fail_at(c, op, "cudaMemcpyAsync of the experts' rows failed");
        return 0;
    }
    /* The pair: the experts' rows go back; this rank's rows return keyed. */
    if (cp_gpu_exchange_tokens(c->g, u, c->s)) return fail_at(c, op, cp_gpu_last_error(c->g));
    size_t total = 0;
    for (int e = 0; e < E; e++) total += (size_t)c->counts[e] * row;
    if (cudaStreamSynchronize(c->s) != cudaSuccess ||
        (total && cudaMemcpy(c->host, send, total, cudaMemcpyDeviceToHost) != cudaSuccess))
        return fail_at(c, op, "reading the returned rows failed");
    size_t at = 0;
    for (int e = 0; e < E; e++)
        for (int64_t j = 0; j < c->counts[e]; j++, at += row)
            for (size_t b = 0; b < row; b++) {
                unsigned char want = row_byte(c->rank, c->step, micro, u, e, j, b, dir) ^ expert_key(e);
                if (c->host[at + b] != want) {
                    char m2[200];
                    snprintf(m2, sizeof m2, "returned row %lld of expert %d, byte %zu: %u, want %u", (long long)j, e, b,
                             c->host[at + b], want);
                    return fail_at(c, op, m2);
                }
            }
    return 0;
}

int main(int argc, char **argv)
{
    char *end = NULL;
    long nsteps = argc > 1 ? strtol(argv[1], &end, 10) : 2;
    if (argc > 2 || (argc > 1 && (*end || nsteps < 1 || nsteps > 1000))) {
        fprintf(stderr, "ep_library: steps %s is not a whole number from 1 to 1000 (usage: ep_library [steps])\n",
                argv[1]);
        return 2;
    }
    int steps = (int)nsteps;
    cp_launch_env env;
    char err[512];
    if (cp_launch_from_env(&env, getenv, err, sizeof err) != 0 || cp_launch_export_comm_id(&env, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    cp_gpu *g;
    if (cp_gpu_init(&g, &CP_PLAN, &CP_KERNELS, &env, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    run_ctx c = { .g = g, .p = cp_gpu_executor(g)->plan, .rank = cp_gpu_rank(g) };
    const cp_plan *p = c.p;
    size_t most = 0;
    int experts = 1;
    for (int u = 0; u < p->nunits; u++) {
        size_t b = (size_t)p->units[u].a2a_numel * cp_dtype_size(p->units[u].ag_dtype);
        if (b > most) most = b;
        if (p->units[u].a2a_experts > experts) experts = p->units[u].a2a_experts;
    }
    c.host = malloc(most ? most : 1);
    c.counts = malloc((size_t)experts * sizeof *c.counts);
    c.peer = malloc((size_t)experts * sizeof *c.peer);
    c.pairs = calloc((size_t)(p->nunits > 0 ? p->nunits : 1), sizeof *c.pairs);
    if (!c.host || !c.counts || !c.peer || !c.pairs || cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "commplan: ep library run: out of memory\n");
        return 2;
    }
    int calls = 0, exchanges = 0, recomputes = 0, rc = 0, ran_with_counts = -1;
    for (c.step = 0; c.step < steps && !rc; c.step++) {
        memset(c.pairs, 0, (size_t)(p->nunits > 0 ? p->nunits : 1) * sizeof *c.pairs);
        for (int i = 0; i < p->nops && !rc; i++) {
            const cp_op *op = &p->ops[i];
            int u = op->unit;
            switch (op->kind) {
            case CP_OP_COPY_OUT: rc = cp_gpu_unshard(g, u, c.s); calls++; break;
            case CP_OP_RESHARD: rc = cp_gpu_reshard(g, u, c.s); calls++; break;
            case CP_OP_PACK: rc = cp_gpu_reduce_grads(g, u, c.s); calls++; break;
            case CP_OP_BACKWARD: {
                size_t bytes = cp_gpu_buffer_bytes(g, u, CP_BUF_GRADS);
                if (bytes && cudaMemsetAsync(cp_gpu_grad(g, p->units[u].first_param), 0x3c, bytes, c.s) != cudaSuccess)
                    rc = fail_at(&c, op, "cudaMemsetAsync of the gradients failed");
                break;
            }
            /* The counts' exchange runs with its dispatch (the unit's next A2A), in one call. */
            case CP_OP_A2A_COUNTS: {
                int j = i + 1;
                while (j < p->nops && !(p->ops[j].kind == CP_OP_A2A && p->ops[j].unit == u)) j++;
                if (j == p->nops) {
                    rc = fail_at(&c, op, "the counts op has no dispatch after it");
                    break;
                }
                rc = exchange(&c, op, &p->ops[j]);
                ran_with_counts = j;
                calls++, exchanges++;
                recomputes += op->a2a_counts_op >= 0; /* activation checkpointing's, in backward */
                break;
            }
            case CP_OP_A2A:
                if (i == ran_with_counts) break;
                rc = exchange(&c, op, op);
                calls++, exchanges++;
                break;
            default: break;
            }
            if (rc && !c.bad) {
                fprintf(stderr, "commplan: ep library run of %s: op %d (%s of %s): %s\n", p->name, i,
                        cp_op_kind_name(op->kind), p->units[u].name, cp_gpu_last_error(g));
                c.bad = 1;
            }
        }
        if (!rc && cp_gpu_synchronize(g, c.s, 60.0) != 0) {
            fprintf(stderr, "commplan: %s\n", cp_gpu_last_error(g));
            rc = -1;
        }
    }
    /* A plan whose tables lost their all-to-alls would check nothing: not a pass. */
    if (!rc && exchanges == 0) {
        fprintf(stderr, "commplan: ep library run of %s: rank %d: the plan has no token exchanges, so no row or "
                "count was checked: run it on an expert-parallel plan (ep > 1)\n", p->name, c.rank);
        rc = -1;
    }
    if (!rc)
        printf("%s rank %d: library calls with expert exchanges in the plan's order for %d step(s): %d calls, %d "
               "token exchanges (%d recomputed counts exchanges), every row and count exact\n", p->name, c.rank,
               steps, calls, exchanges, recomputes);
    free(c.host);
    free(c.counts);
    free(c.peer);
    free(c.pairs);
    cudaStreamDestroy(c.s);
    cp_gpu_destroy(g);
    return rc ? 1 : 0;
}
