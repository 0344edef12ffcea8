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
    const char *dump_dir; /* NULL: no dump; else <dir>/<plan>.rank<R>.json for step 0 */
    FILE *log;            /* progress lines; NULL for quiet */
} cp_sim_options;

/* Returns 0 when every check passed, 1 on a data mismatch, 2 on a runtime error. */
int cp_simulate(const cp_plan *p, const cp_sim_options *opt);

#endif
