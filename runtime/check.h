/* Data checks shared by --simulate (all ranks, host backend) and --check
 * (this rank, GPU): element-unique patterns, expected unsharded values and
 * an independent emulation of the two-stage gradient reduction. */
#ifndef COMMPLAN_CHECK_H
#define COMMPLAN_CHECK_H

#include "commplan.h"

typedef enum {
    CP_PATTERN_UNIQUE = 0, /* element-unique values per parameter and step */
    CP_PATTERN_ORACLE = 1  /* shared/oracle's: param k holds k*1000+i, grad ((i+k)%5+1)*(rank+1) */
} cp_pattern;

float cp_pattern_param(cp_pattern pat, cp_dtype t, int64_t k, int64_t base, int64_t e, int step);
float cp_pattern_grad(cp_pattern pat, cp_dtype t, int64_t k, int64_t e, int rank, int micro, int step);
/* 100 * unit + index in unit (the recordings' numbering: root 0, layer b is b+1). */
int64_t cp_pattern_param_id(const cp_plan *p, int param);

/* Expected reduced grads shared by the ranks of one process (--simulate):
 * the members of a replicate group hold the same shard and expect the same
 * values, so each (unit, replicate group) is computed once per step and the
 * whole check costs O(world x params), not O(world x replicas x params). */
typedef struct cp_expect_cache cp_expect_cache;
cp_expect_cache *cp_expect_cache_create(const cp_plan *p);
void cp_expect_cache_destroy(cp_expect_cache *x);

typedef struct {
    const cp_plan *plan;
    cp_pattern pattern;
    cp_arith arith; /* the backend's reduction arithmetic; CP_ARITH_NCCL after init (the GPU --check) */
    int rank, shard_rank, tp_rank, step;
    int64_t *param_base; /* prefix sums of numel: unique fp32 values across the plan */
    int *members;        /* [q * W + s]: global rank of shard member s of replicate member q */
    /* Expert parallelism's experts units: the same over their shard group
     * (efsdp, [q * efsdp + s]), this rank's key in it and in ep. */
    int *emembers;
    int eshard_rank, esplit_rank;
    int replica_set;     /* this rank's replicate group instance: who shares its expected grads */
    cp_expect_cache *cache; /* NULL: compute this rank's values alone */
    float *expect;          /* scratch: one unit's expected shard without a cache */
    /* Cells: a unit's parameters whose grads are made and reduced together
     * (the whole unit, but where a partial reduction's part cuts it:
     * ChunkedLossWrapper's [norm, lm_head] unit is two cells). */
    int ncells;
    int *cell_of;           /* [param]: its cell */
    int64_t *cell_rs;       /* [2 * cell]: where its reduction's buffer starts in the unit's slot, and its elements */
    unsigned char *packs;   /* [cell * micro_steps + k]: bit 0, the step reduces the cell's grads after its k-th
                               backward in table order; bit 1, that reduction ends in the partial sums
                               (all_reduce_last) (its ops) */
    int *order;             /* [cell * micro_steps + k]: the micro-step of the cell's k-th backward in table order
                               (a pipeline schedule runs them in its own order), -1 past the last */
    int *pos;               /* [cell * micro_steps + m]: k of micro-step m's backward; its inverse */
    int *pack_pos;          /* [cell * micro_steps + m]: k of the backward a pack labelled micro-step m follows */
    float *acc;             /* scratch: each of the W x R members' accumulated unsharded grad */
    float *work;            /* scratch: blocks of CP_BLOCK floats for the run-at-a-time checks */
    long mismatches;
    int replicate_rank; /* this rank's member index in its replicate group */
    int threads;        /* 2: the big loops in two parts, the second on a helper thread (--ranks: one rank alone) */
    float *helper_work; /* the helper's scratch (cp_checker_use_threads) */
    size_t work_floats; /* work's size */
    int solo;           /* --simulate --ranks: this rank alone, its peers stand-ins (simulate.c): replica q's
                           all-reduce input is this replica's value times q + 2 rounded, a TP peer's activation zeros */
} cp_checker;

int cp_checker_init(cp_checker *c, const cp_plan *p, cp_pattern pattern, int rank);
void cp_checker_free(cp_checker *c);
/* Runs the checker's large loops (unsharded checks, grads, expected grads,
 * activations) in two threads: for a rank simulated alone, which has the
 * machine to itself. 0, or -1 out of memory (then one thread). */
int cp_checker_use_threads(cp_checker *c, int n);
/* fn(c, arg, part, nparts) for part 0 .. nparts-1, in two threads where
 * cp_checker_use_threads set them (part 1 on a copy of the checker with
 * its own scratch; its mismatches added after), else fn(c, arg, 0, 1). */
void cp_checker_in_parts(cp_checker *c, void (*fn)(cp_checker *c, void *arg, int part, int nparts), void *arg);
/* Per-unit host buffers in the executor's layouts (see cp_rank_buffers). */
void cp_checker_fill_shards(cp_checker *c, int unit, void *sharded);
void cp_checker_check_unsharded(cp_checker *c, int unit, const void *unsharded, const char *when);
/* The backward of micro-step micro_step into unit's unsharded grads
 * (grad_dtype): assigned on the first backward after a packing (or of the
 * step), added into on later ones. */
/* Whether unit u's backward of micro-step `micro` writes its unsharded
 * grads afresh (the step's first backward of the unit in table order, or
 * the first after a packing) rather than adding into them. */
int cp_checker_grads_fresh(const cp_checker *c, int u, int micro);
/* The same for a backward of a part of the unit's parameters (cp_op's
 * part_first, part_count; 0, 0: all): fresh when every one of them is. */
int cp_checker_grads_fresh_part(const cp_checker *c, int u, int part_first, int part_count, int micro);
void cp_checker_add_grads(cp_checker *c, int unit, int micro_step, void *grads);
/* A part's backward: only its parameters' grads are written. */
void cp_checker_add_grads_part(cp_checker *c, int unit, int part_first, int part_count, int micro_step, void *grads);
void cp_checker_check_grads(cp_checker *c, int unit, const void *sharded_grads);
/* An activation collective's group, from the tables' family names, not the
 * op's own claim alone: TP's on "tp", context parallel's K/V exchange on
 * "cp" (gen/parallel/cp.lua). Sets this rank's key in it and its size and
 * returns 0; an op on any other group (or none: issued locally) is counted
 * as a mismatch, named on one line, and returns -1. */
int cp_checker_act_group(cp_checker *c, const cp_op *op, int *key, int *size);
/* Activation collective op (this rank's index in its group, the group's
 * size): write its input (the slot for a gather, the whole for a
 * reduce-scatter, the buffer for an all-reduce) and check its output exactly. */
void cp_checker_act_input(cp_checker *c, const cp_op *op, int tp_rank, int tp_size, void *in);
void cp_checker_act_output(cp_checker *c, const cp_op *op, int tp_rank, int tp_size, const void *out);
/* Elements first .. first+len-1 of TP rank tp_rank's input of op into out. */
void cp_checker_act_input_part(cp_checker *c, const cp_op *op, int tp_rank, int tp_size, int64_t first, int64_t len,
                               void *out);
/* Pipeline messages: what global rank `sender` sends as the message
 * `tag` of micro-step `micro` (op->count elements of op->dtype into out):
 * a hash of (sender, tag, micro-step, step, element), never zero, so a
 * message from the wrong rank, micro-step or step, or a slot never
 * written, shows. */
void cp_checker_p2p_message(const cp_checker *c, const cp_op *op, int sender, void *out);
/* A received message (host copy) against the sender's: 0, or -1 after one
 * line naming both ranks, tag, micro-step and the first wrong element
 * (counted as a mismatch). */
int cp_checker_p2p_check(cp_checker *c, const cp_op *op, int sender, const void *got);
/* Expert parallelism. The per-expert token counts (n x op->a2a_experts,
 * member-major global expert order) global rank `rank` routes at an
 * A2A_COUNTS in this step: op->a2a_rows rows (half the capacity when 0)
 * from a generator seeded by (rank, step, micro-step, slot, unit); some
 * experts get none, one draw in four fills a member exactly to capacity
 * and leaves the next empty; never past capacity (COMMPLAN_A2A_OVERFLOW=R
 * makes rank R route one row past a member's: the refusal's test;
 * COMMPLAN_A2A_FULL=R fills its members to capacity in turn). */
void cp_checker_a2a_counts(const cp_checker *c, const cp_op *op, int rank, int n, int64_t *counts);
/* Row `row` (op->a2a_dim elements of op->dtype) of global expert `expert`'s
 * tokens that rank sender sends rank receiver at A2A op: a hash of all of
 * them, the step, micro-step, unit and direction, never zero. */
void cp_checker_a2a_row(const cp_checker *c, const cp_op *op, int sender, int receiver, int expert, int64_t row,
                        void *out);
/* A received row (at: its index in the packed output) against the
 * sender's: 0, or -1 after one line (counted as a mismatch). */
int cp_checker_a2a_check_row(cp_checker *c, const cp_op *op, int sender, int receiver, int expert, int64_t row,
                             int64_t at, const void *got);
/* Stand-ins for --simulate --ranks (simulate.c): shard rank s's shards of
 * unit u (orig dtype, total elements), and shard-group members' (global
 * ranks, at most the shard group's size) reduce-scatter inputs for this
 * rank's slot at micro-step micro (reduce dtype, total elements each, into
 * out[i]), each as the checker's model has it. */
void cp_checker_fill_shards_of(cp_checker *c, int unit, int shard_rank, void *sharded);
/* The same shards as t (rounded to the unit's orig dtype first): what
 * that member's copy-in writes into its all-gather slot. */
void cp_checker_fill_shards_as(cp_checker *c, int unit, int shard_rank, cp_dtype t, void *out);
/* A partial reduction's (part_count > 0): its parameters only, its
 * cp_part_total elements each. */
void cp_checker_member_packed(cp_checker *c, int unit, int part_first, int part_count, const int *members, int nmembers,
                              int micro_step, void *const *out);

#endif
