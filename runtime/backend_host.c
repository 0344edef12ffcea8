/* Host backend. Each collective: every member posts its buffer and op
 * signature, waits on the group's barrier, reads its peers' buffers, then
 * waits again so no one reuses a buffer a peer may still read. Members
 * whose signatures differ fail loudly instead of exchanging wrong data. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"

typedef struct {
    pthread_barrier_t barrier;
    const void **ptrs;      /* per member */
    const cp_op **sigs;     /* per member */
} group_instance;

typedef struct {
    int ninstances;
    group_instance *inst;
} family_state;

typedef struct {
    cp_host_world *world;
    int rank;
} rank_ctx;

struct cp_host_world {
    const cp_plan *plan;
    family_state *fam;
    rank_ctx *ranks;
};

cp_host_world *cp_host_world_create(const cp_plan *p)
{
    cp_host_world *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->plan = p;
    w->fam = calloc((size_t)p->nfamilies, sizeof *w->fam);
    w->ranks = calloc((size_t)p->world_size, sizeof *w->ranks);
    if (!w->fam || !w->ranks) { cp_host_world_destroy(w); return NULL; }
    for (int f = 0; f < p->nfamilies; f++) {
        int size = p->families[f].size;
        family_state *fs = &w->fam[f];
        fs->inst = calloc((size_t)(p->world_size / size), sizeof *fs->inst);
        if (!fs->inst) { cp_host_world_destroy(w); return NULL; }
        for (int i = 0; i < p->world_size / size; i++) {
            group_instance *g = &fs->inst[i];
            g->ptrs = calloc((size_t)size, sizeof *g->ptrs);
            g->sigs = calloc((size_t)size, sizeof *g->sigs);
            if (!g->ptrs || !g->sigs || pthread_barrier_init(&g->barrier, NULL, (unsigned)size) != 0) {
                free(g->ptrs); free(g->sigs);
                g->ptrs = NULL; g->sigs = NULL;
                cp_host_world_destroy(w);
                return NULL;
            }
            fs->ninstances = i + 1;
        }
    }
    for (int r = 0; r < p->world_size; r++) { w->ranks[r].world = w; w->ranks[r].rank = r; }
    return w;
}

void cp_host_world_destroy(cp_host_world *w)
{
    if (!w) return;
    if (w->fam) {
        for (int f = 0; f < w->plan->nfamilies; f++) {
            family_state *fs = &w->fam[f];
            for (int i = 0; i < fs->ninstances; i++) {
                pthread_barrier_destroy(&fs->inst[i].barrier);
                free(fs->inst[i].ptrs);
                free(fs->inst[i].sigs);
            }
            free(fs->inst);
        }
    }
    free(w->fam);
    free(w->ranks);
    free(w);
}

/* Post, wait, check signatures. Returns the instance and this rank's key. */
static group_instance *rendezvous(cp_backend *b, const cp_op *op, const void *ptr, int *key_out, int *size_out,
                                  int *bad)
{
    rank_ctx *rc = b->ctx;
    const cp_plan *p = rc->world->plan;
    int color, key;
    cp_group_of(p, op->family, rc->rank, &color, &key);
    group_instance *g = &rc->world->fam[op->family].inst[color];
    g->ptrs[key] = ptr;
    g->sigs[key] = op;
    pthread_barrier_wait(&g->barrier);
    int size = p->families[op->family].size;
    *bad = 0;
    for (int m = 0; m < size; m++) {
        const cp_op *o = g->sigs[m];
        if (o->kind != op->kind || o->count != op->count || o->dtype != op->dtype || o->reduce_op != op->reduce_op) {
            fprintf(stderr, "commplan: rank %d: %s on group %s disagrees with member %d (rank %d): %s count %ld\n",
                    rc->rank, cp_op_kind_name(op->kind), p->families[op->family].name, m,
                    cp_group_member(p, op->family, color, m), cp_op_kind_name(o->kind), (long)o->count);
            *bad = 1;
        }
    }
    *key_out = key;
    *size_out = size;
    return g;
}

static int host_all_gather(cp_backend *b, const cp_op *op, const void *in, void *out)
{
    int key, size, bad;
    group_instance *g = rendezvous(b, op, in, &key, &size, &bad);
    size_t bytes = (size_t)op->count * cp_dtype_size(op->dtype);
    if (!bad)
        for (int m = 0; m < size; m++) {
            char *dst = (char *)out + (size_t)m * bytes;
            if (dst != g->ptrs[m]) memcpy(dst, g->ptrs[m], bytes);
        }
    pthread_barrier_wait(&g->barrier);
    return bad ? -1 : 0;
}

static int host_reduce_scatter(cp_backend *b, const cp_op *op, const void *in, void *out)
{
    int key, size, bad;
    group_instance *g = rendezvous(b, op, in, &key, &size, &bad);
    if (!bad) {
        float vals[size];
        for (int64_t i = 0; i < op->count; i++) {
            for (int m = 0; m < size; m++) vals[m] = cp_load(op->dtype, g->ptrs[m], (int64_t)key * op->count + i);
            cp_store(op->dtype, out, i, cp_reduce_values(op->dtype, op->reduce_op, vals, size));
        }
    }
    pthread_barrier_wait(&g->barrier);
    return bad ? -1 : 0;
}

static int host_all_reduce(cp_backend *b, const cp_op *op, void *buf)
{
    int key, size, bad;
    group_instance *g = rendezvous(b, op, buf, &key, &size, &bad);
    size_t bytes = (size_t)op->count * cp_dtype_size(op->dtype);
    void *tmp = bad ? NULL : malloc(bytes ? bytes : 1);
    if (!bad && !tmp) {
        fprintf(stderr, "commplan: out of host memory in all_reduce\n");
        bad = 1;
    }
    if (!bad) {
        float vals[size];
        for (int64_t i = 0; i < op->count; i++) {
            for (int m = 0; m < size; m++) vals[m] = cp_load(op->dtype, g->ptrs[m], i);
            cp_store(op->dtype, tmp, i, cp_reduce_values(op->dtype, op->reduce_op, vals, size));
        }
    }
    /* Everyone has read every input before anyone overwrites its own. */
    pthread_barrier_wait(&g->barrier);
    if (tmp) { memcpy(buf, tmp, bytes); free(tmp); }
    return bad ? -1 : 0;
}

void cp_host_backend_init(cp_backend *b, cp_host_world *w, int rank)
{
    b->ctx = &w->ranks[rank];
    b->all_gather = host_all_gather;
    b->reduce_scatter = host_reduce_scatter;
    b->all_reduce = host_all_reduce;
}
