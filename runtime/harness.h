/* One rank's data checks and dumps around the executor, the same for the
 * host simulation (every rank a thread) and the GPU --check (this rank):
 * the step's shards are written with the pattern, the compute
 * placeholders check every unsharded parameter exactly and write the
 * gradients, the reduced gradients are checked after the step, and step 0
 * can be dumped in the FSDP2 recordings' format. Every access goes through
 * the executor's backend (cp_executor_read / cp_executor_write). */
#ifndef COMMPLAN_HARNESS_H
#define COMMPLAN_HARNESS_H

#include <stdio.h>

#include "check.h"
#include "commplan.h"
#include "safeio.h"

typedef struct {
    cp_executor *ex;
    cp_checker check;
    void *scratch; /* host copy of one buffer: as large as the largest */
    FILE *dump;    /* the recordings' format, or NULL: dump_out.f, renamed into place by cp_harness_finish */
    cp_out dump_out;
    int dump_first_log, marked_backward;
    long backward_from; /* first op index after micro-step 0's forwards */
    int error;     /* a backend read or write failed */
} cp_harness;

/* Installs the compute and collective hooks on ex. Returns 0 or -1. */
int cp_harness_init(cp_harness *h, cp_executor *ex, cp_pattern pattern);
void cp_harness_free(cp_harness *h);
/* Opens DIR/<plan>.rank<R>.json (creating DIR) for the dump: step 0's
 * shards, every step's collectives, the last step's grads. Written to a
 * temporary file beside it (runtime/safeio.h) and renamed over it by
 * cp_harness_finish, never through a symlink; cp_harness_free without a
 * finish leaves no file. */
int cp_harness_open_dump(cp_harness *h, const char *dir);
/* Before step s: pattern shards in, sharded grads poisoned. 0 or -1. */
int cp_harness_begin_step(cp_harness *h, int step);
/* After the step: reduced grads checked (mismatches counted). 0 or -1. */
int cp_harness_end_step(cp_harness *h);
/* After the last step: the dump's grads and its end. 0 or -1. */
int cp_harness_finish(cp_harness *h);
/* The collective hook cp_harness_init installs (user: the cp_harness),
 * for callers that install their own compute hook. */
void cp_harness_on_collective(void *user, cp_executor *ex, const cp_op *op, const void *in, int64_t in_n,
                              const void *out, int64_t out_n);

/* The expert-parallel hook cp_harness_init installs (user: the cp_harness):
 * counts drawn and given, received counts and every received row checked. */
int cp_harness_on_a2a(void *user, cp_executor *ex, const cp_op *op, int after);

#endif
