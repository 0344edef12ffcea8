/* --simulate: run every rank of a plan on the host backend with
 * element-unique data and check unshard and reduction results exactly. */
#ifndef COMMPLAN_SIMULATE_H
#define COMMPLAN_SIMULATE_H

#include <stdio.h>

#include "commplan.h"

typedef enum {
    CP_PATTERN_UNIQUE = 0, /* element-unique values per parameter and step */
    CP_PATTERN_ORACLE = 1  /* shared/oracle's: param k holds k*1000+i, grad ((i+k)%5+1)*(rank+1) */
} cp_pattern;

typedef struct {
    int steps;
    cp_pattern pattern;
    const char *dump_dir; /* NULL: no dump; else <dir>/<plan>.rank<R>.json for step 0 */
    FILE *log;            /* progress lines; NULL for quiet */
} cp_sim_options;

/* Pattern values (exposed for tests). k identifies the parameter. */
float cp_pattern_param(cp_pattern pat, cp_dtype t, int64_t k, int64_t base, int64_t e, int step);
float cp_pattern_grad(cp_pattern pat, cp_dtype t, int64_t k, int64_t e, int rank, int micro, int step);
/* Parameter id used by the patterns: 100 * unit + index in unit (the
 * recordings' numbering: root unit 0, layer b unit b+1). */
int64_t cp_pattern_param_id(const cp_plan *p, int param);

/* Returns 0 when every check passed, 1 on a data mismatch, 2 on a runtime error. */
int cp_simulate(const cp_plan *p, const cp_sim_options *opt);

#endif
