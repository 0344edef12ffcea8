/* The plan binary's CLI. Built once per plan: CP_PLAN names the generated
 * table (e.g. -DCP_PLAN=llama70b_plan). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commplan.h"
#include "launch.h"
#include "simulate.h"
#ifdef CP_WITH_GPU
#include "gpu_run.h"
#ifndef CP_KERNELS
#error "GPU builds need -DCP_KERNELS=<name>_kernels"
#endif
extern const cp_gpu_kernels CP_KERNELS;
#endif

#ifndef CP_PLAN
#error "compile with -DCP_PLAN=<name>_plan"
#endif
#ifndef CP_VERSION /* the Makefile passes the VERSION file's */
#define CP_VERSION "unknown"
#endif
extern const cp_plan CP_PLAN;

static void usage(FILE *f, const cp_plan *p)
{
    fprintf(f,
            "usage: %s [--simulate [--steps N] [--pattern unique|oracle] [--dump DIR] [--arith gloo|nccl]] [--dry-run]\n"
            "          [--check [--steps N]] [--warmup N] [--iters N] [--graph] [--timeout S] [--trace FILE]\n"
            "          [--standin [--rank R]] [--world-size N] [--rank R] [--quiet] [--version] [--help]\n"
            "\n"
            "Plan %s (fingerprint %s): %d ranks, %d units, %d parameters, %d ops per step.\n"
            "\n"
            "  --simulate        run every rank as a thread on the host backend and check exactly that\n"
            "                    unshard rebuilds every parameter and reduction yields the exact average\n"
            "  --steps N         steps to simulate (default 1); each step uses fresh values\n"
            "  --pattern P       unique (default): element-unique values; oracle: the FSDP2 recordings' values\n"
            "  --dump DIR        write each rank's step-0 shards, every step's collectives (between stepN marks)\n"
            "                    and the last step's grads as JSON into DIR (the FSDP2 recordings' format)\n"
            "  --arith A         reductions of --simulate with gloo's arithmetic (default: sum, then divide) or\n"
            "                    nccl's (ncclAvg premultiplies by 1/n, ring order), as FSDP2 on that backend does;\n"
            "                    the GPU --check always expects NCCL's\n"
            "  --dry-run         print the step's ops in issue order and exit\n"
            "GPU (one process per rank under torchrun, srun or mpirun; no mode flag: time the step):\n"
            "  --check           run the step on this rank's GPU with the same patterns and exact checks (with\n"
            "                    --graph: captured once as a CUDA graph and replayed every step, checks included;\n"
            "                    with --dump DIR: this rank's steps in the recordings' format)\n"
            "  --warmup N        untimed steps before timing (default 5)\n"
            "  --iters N         timed steps and per-op repetitions (default 20)\n"
            "  --graph           also capture the step as one CUDA graph and time its replay\n"
            "  --standin         time rank R (default 0) of the plan alone on this GPU: every group is a one-rank\n"
            "                    communicator, so each collective is issued with the plan's counts but moves only\n"
            "                    this rank's slot; host enqueue and graph-launch times are the plan's\n"
            "  --timeout S       fail instead of hanging when a step takes longer than S seconds (default 300)\n"
            "  --trace FILE      also write one measured step (after the warmup) as Chrome trace events, a track\n"
            "                    per stream, in the format of the plan's predicted trace.json (open in Perfetto)\n"
            "  --world-size N    refuse to run unless N equals the plan's world size (default: the launcher's,\n"
            "                    from torchrun $WORLD_SIZE, Open MPI $OMPI_COMM_WORLD_SIZE or Slurm $SLURM_NTASKS)\n"
            "  --rank R          refuse to run unless 0 <= R < world size (default: the launcher's rank)\n"
            "  --quiet           no progress output\n"
            "  --version         print commplan's version and the plan's name and fingerprint\n",
            "commplan", p->name, p->fingerprint, p->world_size, p->nunits, p->nparams, p->nops);
}

static int parse_int(const char *flag, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || *end || end == s || v < min || v > max) {
        fprintf(stderr, "commplan: %s needs an integer in [%ld, %ld], got '%s'\n", flag, min, max, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

static void dry_run(const cp_plan *p)
{
    printf("# plan %s, fingerprint %s, %d ranks, shard group %d, replicate group %d, tp %d (%d TP class%s; TP "
           "rank 0's ops below)\n", p->name, p->fingerprint, p->world_size, p->shard_size, p->replicate_size, p->tp_size,
           p->nclasses, p->nclasses == 1 ? "" : "es");
    printf("# %-5s %-5s %-17s %-24s %-14s %-5s %12s %s\n", "op", "micro", "kind", "unit", "group", "dtype", "count",
           "reduce");
    for (int i = 0; i < p->nops; i++) {
        const cp_op *o = &p->ops[i];
        int coll = cp_op_descs[o->kind].action == CP_ACT_COLLECTIVE;
        printf("  %-5d %-5d %-17s %-24s %-14s %-5s %12ld %s\n", i, o->micro_step, cp_op_kind_name(o->kind),
               p->units[o->unit].name, coll ? (o->family >= 0 ? p->families[o->family].name : "local") : "-",
               coll ? cp_dtype_name(o->dtype) : "-", coll ? (long)o->count : 0L,
               coll && cp_op_descs[o->kind].collective != CP_COLL_ALL_GATHER ? (o->reduce_op == CP_AVG ? "avg" : "sum")
                                                                              : "-");
    }
}

int main(int argc, char **argv)
{
    const cp_plan *p = &CP_PLAN;
    int simulate = 0, dry = 0, quiet = 0, check = 0, graph = 0, standin = 0;
    const char *trace = NULL;
    long steps = 1, world = -1, rank = -1, warmup = 5, iters = 20, timeout = 300;
    cp_sim_options opt = { .steps = 1, .pattern = CP_PATTERN_UNIQUE };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout, p); return 0; }
        else if (!strcmp(a, "--version")) {
            printf("commplan %s, plan %s (fingerprint %s)\n", CP_VERSION, p->name, p->fingerprint);
            return 0;
        }
        else if (!strcmp(a, "--simulate")) simulate = 1;
        else if (!strcmp(a, "--dry-run")) dry = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--check")) check = 1;
        else if (!strcmp(a, "--graph")) graph = 1;
        else if (!strcmp(a, "--standin")) standin = 1;
        else if (!strcmp(a, "--warmup")) { if (parse_int(a, next, 0, 1000000, &warmup)) return 2; i++; }
        else if (!strcmp(a, "--iters")) { if (parse_int(a, next, 1, 1000000, &iters)) return 2; i++; }
        else if (!strcmp(a, "--timeout")) { if (parse_int(a, next, 1, 86400, &timeout)) return 2; i++; }
        else if (!strcmp(a, "--steps")) { if (parse_int(a, next, 1, 1000000, &steps)) return 2; i++; }
        else if (!strcmp(a, "--world-size")) { if (parse_int(a, next, 1, 1L << 30, &world)) return 2; i++; }
        else if (!strcmp(a, "--rank")) { if (parse_int(a, next, 0, 1L << 30, &rank)) return 2; i++; }
        else if (!strcmp(a, "--trace")) { if (!next) { fprintf(stderr, "commplan: --trace needs a file name\n"); return 2; } trace = next; i++; }
        else if (!strcmp(a, "--dump")) { if (!next) { fprintf(stderr, "commplan: --dump needs a directory\n"); return 2; } opt.dump_dir = next; i++; }
        else if (!strcmp(a, "--arith")) {
            if (next && !strcmp(next, "gloo")) opt.arith = CP_ARITH_GLOO;
            else if (next && !strcmp(next, "nccl")) opt.arith = CP_ARITH_NCCL;
            else { fprintf(stderr, "commplan: --arith takes gloo or nccl, got '%s'\n", next ? next : ""); return 2; }
            i++;
        } else if (!strcmp(a, "--pattern")) {
            if (next && !strcmp(next, "unique")) opt.pattern = CP_PATTERN_UNIQUE;
            else if (next && !strcmp(next, "oracle")) opt.pattern = CP_PATTERN_ORACLE;
            else { fprintf(stderr, "commplan: --pattern takes unique or oracle, got '%s'\n", next ? next : ""); return 2; }
            i++;
        } else {
            fprintf(stderr, "commplan: unknown option '%s'; see --help\n", a);
            return 2;
        }
    }
    if (simulate + dry + check > 1) {
        fprintf(stderr, "commplan: --simulate, --dry-run and --check are different runs: give one\n");
        return 2;
    }
    if (opt.dump_dir && !opt.dump_dir[0]) {
        fprintf(stderr, "commplan: --dump needs a directory, got ''\n");
        return 2;
    }
    if (trace && (simulate || dry || check)) {
        fprintf(stderr, "commplan: --trace records a timed step on the GPU; drop --simulate, --dry-run or --check\n");
        return 2;
    }
    /* A launcher's world must be the plan's (torchrun, Open MPI or Slurm variables). */
    cp_launch_env env;
    char err[512];
    if (cp_launch_from_env(&env, getenv, err, sizeof err) != 0) {
        fprintf(stderr, "commplan: %s\n", err);
        return 2;
    }
    if (strcmp(env.source, "none") != 0) {
        if (world < 0) world = env.world_size;
        if (rank < 0) rank = env.rank;
    }
    if (world >= 0 && world != p->world_size) {
        fprintf(stderr, "commplan: world size %ld does not match plan %s (generated for %d ranks); "
                        "launch %d ranks or regenerate the plan with world_size = %ld\n",
                world, p->name, p->world_size, p->world_size, world);
        return 2;
    }
    if (rank >= 0 && rank >= p->world_size) {
        fprintf(stderr, "commplan: rank %ld is outside plan %s's %d ranks (valid: 0..%d)\n", rank, p->name,
                p->world_size, p->world_size - 1);
        return 2;
    }
    if (dry) { dry_run(p); return 0; }
    if (standin) {
        if (simulate || check) {
            fprintf(stderr, "commplan: --standin times one rank with one-rank communicators and cannot be checked; "
                            "drop --check/--simulate or launch all %d ranks\n", p->world_size);
            return 2;
        }
        env.standin = 1;
        env.world_size = p->world_size;
        env.rank = rank >= 0 ? (int)rank : 0;
        if (strcmp(env.source, "none") == 0) env.local_rank = 0;
        env.comm_id[0] = '\0';
    }
    if (!simulate && !check && opt.dump_dir) {
        fprintf(stderr, "commplan: --dump records a checked run: use it with --simulate or --check\n");
        return 2;
    }
    if (!simulate) {
#ifdef CP_WITH_GPU
        cp_gpu_run_options go = { .check = check, .graph = graph, .steps = (int)steps, .warmup = (int)warmup,
                                  .iters = (int)iters, .timeout_s = (double)timeout, .pattern = opt.pattern,
                                  .dump_dir = opt.dump_dir, .quiet = quiet, .trace_file = trace };
        return cp_gpu_run(p, &CP_KERNELS, &env, &go);
#else
        (void)check; (void)graph; (void)warmup; (void)iters; (void)timeout; (void)trace;
        fprintf(stderr, "commplan: this build has no GPU backend (nvcc was not found at build time); "
                        "use --simulate or --dry-run, or rebuild where CUDA is installed\n");
        return 2;
#endif
    }
    opt.steps = (int)steps;
    opt.log = quiet ? NULL : stdout;
    return cp_simulate(p, &opt);
}
