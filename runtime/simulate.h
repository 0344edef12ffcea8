/* --simulate: run every rank of a plan on the host backend with
 * element-unique data and check unshard and reduction results exactly. */
#ifndef COMMPLAN_SIMULATE_H
#define COMMPLAN_SIMULATE_H

#include <stdio.h>

#include "check.h"
#include "commplan.h"

typedef struct {
    int steps;
    cp_pattern pattern;
    cp_arith arith;       /* reduction arithmetic: gloo (default, the gloo recordings) or nccl */
    const char *dump_dir; /* NULL: no dump; else <dir>/<plan>.rank<R>.json for step 0 */
    FILE *log;            /* progress lines; NULL for quiet */
    const int *only;      /* --ranks: simulate these ranks one at a time, each alone with stand-ins for its peers */
    int nonly;            /* 0: every rank, together */
    double timeout_s;     /* a collective whose members do not all arrive within it fails (0: never) */
} cp_sim_options;

/* Returns 0 when every check passed, 1 on a data mismatch, 2 on a runtime
 * error or a plan too large for this machine's memory (refused up front). */
int cp_simulate(const cp_plan *p, const cp_sim_options *opt);

/* Host bytes --simulate needs, from the plan's tables: per rank the arena,
 * shards and sharded grads and the checks' scratch; times the world. */
int64_t cp_simulate_bytes(const cp_plan *p, int64_t *per_rank);
/* Bytes this machine can give: MemAvailable (/proc/meminfo), lowered by a
 * cgroup limit; sysconf's available pages as the fallback; -1 if unknown. */
int64_t cp_host_available_bytes(void);
/* 0 when the simulation fits; else one line on stderr and -1. */
int cp_simulate_check_memory(const cp_plan *p);

#endif
