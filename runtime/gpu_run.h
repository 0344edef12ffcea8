/* The plan binary's GPU modes: --check and the timing report. */
#ifndef COMMPLAN_GPU_RUN_H
#define COMMPLAN_GPU_RUN_H

#include "check.h"
#include "cp_gpu.h"

typedef struct {
    int check;        /* exact data checks for this rank */
    int graph;        /* also capture the step as a CUDA graph and replay it */
    int steps;        /* --check steps */
    int warmup, iters;
    double timeout_s; /* per synchronize */
    cp_pattern pattern;
    const char *dump_dir; /* --check --dump: step 0 in the recordings' format */
    int quiet;
    const char *trace_file; /* --trace: one measured step as Chrome trace events (trace.json's format) */
} cp_gpu_run_options;

/* Returns 0 on success, 1 on a data mismatch, 2 on an error (message on stderr). */
int cp_gpu_run(const cp_plan *p, const cp_gpu_kernels *k, const cp_launch_env *env, const cp_gpu_run_options *o);

#endif
