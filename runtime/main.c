/* The plan binary's CLI. Built once per plan: CP_PLAN names the generated
 * table (e.g. -DCP_PLAN=llama70b_plan). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commplan.h"
#include "launch.h"
#include "rendezvous.h"
#include "safeio.h"
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
            "usage: %s [--simulate [--steps N] [--pattern unique|oracle] [--dump DIR] [--arith gloo|nccl]\n"
            "          [--ranks auto|R,R,...]] [--dry-run]\n"
            "          [--check [--steps N]] [--warmup N] [--iters N] [--graph] [--timeout S] [--trace FILE]\n"
            "          [--standin [--rank R]] [--rendezvous-only] [--world-size N] [--rank R] [--quiet] [--version]\n"
            "          [--help]\n"
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
            "  --ranks LIST      simulate only these ranks, one at a time, each alone with stand-ins for its peers\n"
            "                    (their buffers made from the same patterns; docs/simulate.md says what this checks);\n"
            "                    auto: the last rank of each TP class. For plans too large for all ranks at once\n"
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
            "  --timeout S       fail instead of hanging when a step takes longer than S seconds (default 300;\n"
            "                    --simulate: a collective's members all arriving); COMMPLAN_CURSOR_DUMP=PREFIX\n"
            "                    then writes every rank's step and op into PREFIX<pid> (docs/diagnosis.md)\n"
            "  --trace FILE      also write one measured step (after the warmup) as Chrome trace events, a track\n"
            "                    per stream, in the format of the plan's predicted trace.json (open in Perfetto)\n"
            "  --world-size N    refuse to run unless N equals the plan's world size (default: the launcher's,\n"
            "                    from torchrun $WORLD_SIZE, Open MPI $OMPI_COMM_WORLD_SIZE or Slurm $SLURM_NTASKS)\n"
            "  --rank R          refuse to run unless 0 <= R < world size (default: the launcher's rank)\n"
            "  --rendezvous-only under a launcher: read its variables, carry a stand-in NCCL id (random bytes)\n"
            "                    from rank 0 to every rank through the channel a GPU run would use (torchrun's\n"
            "                    store, COMMPLAN_ID_FILE), compare plans across ranks where the channel can,\n"
            "                    print one line per rank and stop before NCCL (no GPU, NCCL or CUDA needed)\n"
            "  --quiet           no progress output\n"
            "  --version         print commplan's version and the plan's name and fingerprint\n"
            "\n"
            "A flag the chosen run would ignore is refused. Outputs (--dump, --trace) are written to a temporary\n"
            "file beside them and renamed into place; a symlink under an output's name is replaced, not followed.\n",
            "commplan", p->name, p->fingerprint, p->world_size, p->nunits, p->nparams, p->nops);
}

static int parse_int(const char *flag, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || *end || end == s || v < min || v > max) {
        cp_error("%s needs an integer in [%ld, %ld], got '%s'", flag, min, max, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

/* The runs a flag is for. A flag the chosen run would ignore is refused:
 * a user who gives it expects it to change something. */
enum { RUN_SIM = 1, RUN_DRY = 2, RUN_CHECK = 4, RUN_TIME = 8 /* no mode flag, or --standin */, RUN_RDZV = 16 };
enum { F_STEPS, F_PATTERN, F_DUMP, F_ARITH, F_WARMUP, F_ITERS, F_GRAPH, F_TIMEOUT, F_TRACE, F_STANDIN, F_QUIET, F_RANKS,
       F_COUNT };
static const struct {
    const char *flag;
    unsigned runs;
    const char *what;
} FLAG_RUNS[F_COUNT] = {
    [F_STEPS] = { "--steps", RUN_SIM | RUN_CHECK, "counts the steps of --simulate and --check" },
    [F_PATTERN] = { "--pattern", RUN_SIM | RUN_CHECK, "chooses the values of --simulate and --check" },
    [F_DUMP] = { "--dump", RUN_SIM | RUN_CHECK, "records a checked run (--simulate or --check)" },
    [F_ARITH] = { "--arith", RUN_SIM, "chooses --simulate's reduction arithmetic (--check always expects NCCL's)" },
    [F_WARMUP] = { "--warmup", RUN_TIME, "counts the untimed steps of a timing run on the GPU (no mode flag)" },
    [F_ITERS] = { "--iters", RUN_TIME, "counts the timed steps of a timing run on the GPU (no mode flag)" },
    [F_GRAPH] = { "--graph", RUN_TIME | RUN_CHECK, "replays the step as a CUDA graph (a timing run or --check)" },
    [F_TIMEOUT] = { "--timeout", RUN_SIM | RUN_TIME | RUN_CHECK,
                    "bounds a step on the GPU (a timing run or --check) or a collective's wait (--simulate)" },
    [F_TRACE] = { "--trace", RUN_TIME, "records a timed step on the GPU (no mode flag)" },
    [F_STANDIN] = { "--standin", RUN_TIME, "times one rank of the plan alone on a GPU (no mode flag)" },
    [F_QUIET] = { "--quiet", RUN_SIM | RUN_CHECK | RUN_TIME | RUN_RDZV, "silences progress output" },
    [F_RANKS] = { "--ranks", RUN_SIM, "picks the ranks --simulate runs alone with stand-in peers" },
};

static void dry_run(const cp_plan *p)
{
    if (p->pp_size > 1)
        /* a class per (pipeline rank, TP class): the ops below are rank 0's */
        printf("# plan %s, fingerprint %s, %d ranks, pp %d, shard group %d, replicate group %d, tp %d (%d classes, "
               "one per pipeline rank and TP class; rank 0's ops below, sends and receives to the pp peer shown)\n",
               p->name, p->fingerprint, p->world_size, p->pp_size, p->shard_size, p->replicate_size, p->tp_size,
               p->nclasses);
    else
        printf("# plan %s, fingerprint %s, %d ranks, shard group %d, replicate group %d, tp %d (%d TP class%s; TP "
               "rank 0's ops below)\n", p->name, p->fingerprint, p->world_size, p->shard_size, p->replicate_size,
               p->tp_size, p->nclasses, p->nclasses == 1 ? "" : "es");
    printf("# %-5s %-5s %-17s %-24s %-14s %-5s %12s %s\n", "op", "micro", "kind", "unit", "group", "dtype", "count",
           "reduce");
    for (int i = 0; i < p->nops; i++) {
        const cp_op *o = &p->ops[i];
        int coll = cp_op_descs[o->kind].action == CP_ACT_COLLECTIVE;
        int p2p = cp_op_descs[o->kind].action == CP_ACT_P2P;
        char peer[32];
        snprintf(peer, sizeof peer, "pp peer %d", o->peer);
        printf("  %-5d %-5d %-17s %-24s %-14s %-5s %12ld %s\n", i, o->micro_step, cp_op_kind_name(o->kind),
               p->units[o->unit].name, coll ? (o->family >= 0 ? p->families[o->family].name : "local") : p2p ? peer : "-",
               coll || p2p ? cp_dtype_name(o->dtype) : "-", coll || p2p ? (long)o->count : 0L,
               coll && cp_op_descs[o->kind].collective != CP_COLL_ALL_GATHER ? (o->reduce_op == CP_AVG ? "avg" : o->reduce_op == CP_MAX ? "max" : o->reduce_op == CP_PREMUL_SUM ? "premul_sum" : "sum")
                                                                              : "-");
    }
}

static const char *channel_name(int c)
{
    switch (c) {
    case CP_ID_ALONE: return "none (one rank)";
    case CP_ID_NCCL_COMM_ID: return "NCCL_COMM_ID";
    case CP_ID_FILE: return "COMMPLAN_ID_FILE";
    case CP_ID_TCPSTORE: return "torchrun's store";
    case CP_ID_MASTER_ADDR: return "MASTER_ADDR:MASTER_PORT (NCCL_COMM_ID)";
    default: return "?";
    }
}

/* --rendezvous-only: the launch path of a GPU run up to NCCL, on any
 * machine. The id is 128 random bytes where ncclGetUniqueId would make one;
 * each rank prints a hash of what it received, so a test sees every rank
 * hold rank 0's bytes. */
static int rendezvous_only(const cp_plan *p, cp_launch_env *env, int quiet)
{
    unsigned char id[128] = { 0 };
    char err[1024];
    if (env->rank == 0 && env->id_channel != CP_ID_NCCL_COMM_ID && env->id_channel != CP_ID_MASTER_ADDR) {
        FILE *f = fopen("/dev/urandom", "rb");
        int ok = f && fread(id, 1, sizeof id, f) == sizeof id;
        if (f) fclose(f);
        if (!ok) {
            cp_error("rank 0: reading 128 random bytes from /dev/urandom for the stand-in NCCL id failed");
            return 2;
        }
    }
    cp_rendezvous_info info = { 0 };
    int how = cp_rendezvous_share_plan(env, p->name, p->fingerprint, id, sizeof id, env->init_timeout_s, &info, err,
                                       sizeof err);
    /* No NCCL init follows to tell rank 0 that every rank holds the id:
     * a barrier instead, after which rank 0 removes the id file, so that a
     * second run in the same job never reads this run's id. */
    if (how == CP_RDZV_SHARED &&
        cp_rendezvous_confirm(env, p->fingerprint, id, sizeof id, env->init_timeout_s, err, sizeof err) != 0)
        how = CP_RDZV_ERROR;
    if (how == CP_RDZV_ERROR) {
        cp_error("%s", err);
        return 2;
    }
    uint64_t h = 1469598103934665603ULL; /* FNV-1a over the id's bytes */
    for (size_t i = 0; i < sizeof id; i++) h = (h ^ id[i]) * 1099511628211ULL;
    if (quiet) return 0;
    if (how == CP_RDZV_NCCL_OWN)
        printf("%s rank %d of %d (%s): rendezvous through %s: every rank makes the id itself, nothing travels; "
               "plans are compared by NCCL after init; stopping before NCCL (--rendezvous-only)\n", p->name, env->rank,
               env->world_size, env->source, channel_name(env->id_channel));
    else
        printf("%s rank %d of %d (%s): rendezvous through %s, launch %lld: stand-in NCCL id %016llx, plan %s on %s; "
               "stopping before NCCL (--rendezvous-only)\n", p->name, env->rank, env->world_size, env->source,
               channel_name(env->id_channel), info.launch, (unsigned long long)h, p->fingerprint,
               env->id_channel == CP_ID_TCPSTORE ? "every rank" : "this rank (compared by NCCL after init)");
    return 0;
}

/* --simulate and --dry-run need no launcher: under torchrun, srun or mpirun
 * (its variables present, even ones that disagree with the plan) they run
 * as they would alone and say once, on stderr, that the variables are not
 * used. Only integers from the environment reach the line. */
static void launcher_note(const cp_plan *p, int simulate)
{
    static const struct { const char *source, *vars[3]; } L[] = {
        { "torchrun", { "RANK", "WORLD_SIZE", "LOCAL_RANK" } },
        { "openmpi", { "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK" } },
        { "slurm", { "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID" } },
    };
    char names[64] = "";
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++)
        for (int k = 0; k < 3; k++)
            if (getenv(L[i].vars[k])) {
                size_t n = strlen(names);
                snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", L[i].source);
                break;
            }
    if (!names[0]) return;
    cp_launch_env env;
    char err[1024], what[160];
    if (cp_launch_ranks_from_env(&env, getenv, err, sizeof err) == 0 && strcmp(env.source, "none") != 0)
        snprintf(what, sizeof what, "%s, rank %d of %d", env.source, env.rank, env.world_size);
    else snprintf(what, sizeof what, "%s", names);
    if (simulate)
        fprintf(stderr, "note: --simulate runs all %d ranks of plan %s in this process; the launcher's variables (%s) "
                "are not used\n", p->world_size, p->name, what);
    else
        fprintf(stderr, "note: --dry-run prints plan %s's ops and needs no launcher; the launcher's variables (%s) are "
                "not used\n", p->name, what);
}

/* --ranks LIST: ranks (comma-separated) or "auto", the last rank of each TP
 * class (the highest shard, replicate and TP coordinates). */
enum { MAX_ONLY = 64 };
static int parse_ranks(const cp_plan *p, const char *s, int *out)
{
    int n = 0;
    if (s && !strcmp(s, "auto")) {
        int seen[CP_MAX_MESH_DIMS * 64] = { 0 }, want = p->nclasses > 0 ? p->nclasses : 1;
        for (int r = p->world_size - 1; r >= 0 && n < want && n < MAX_ONLY; r--) {
            cp_plan v;
            cp_plan_view(p, r, &v);
            if (v.view_class < 0 || v.view_class >= (int)(sizeof seen / sizeof seen[0]) || seen[v.view_class]) continue;
            seen[v.view_class] = 1;
            out[n++] = r;
        }
        return n;
    }
    const char *c = s ? s : "";
    while (*c) {
        char *end;
        errno = 0;
        long v = strtol(c, &end, 10);
        if (end == c || errno || v < 0 || v >= p->world_size || (*end && *end != ',') || n == MAX_ONLY) {
            cp_error("--ranks takes auto or up to %d ranks 0..%d separated by commas, got '%s'", MAX_ONLY,
                     p->world_size - 1, s ? s : "");
            return -1;
        }
        out[n++] = (int)v;
        c = *end ? end + 1 : end;
        if (*end && !*c) { cp_error("--ranks: a rank after the last comma is missing in '%s'", s); return -1; }
    }
    if (n == 0) { cp_error("--ranks takes auto or ranks separated by commas, got ''"); return -1; }
    return n;
}

static int run(int argc, char **argv)
{
    const cp_plan *p = &CP_PLAN;
    int simulate = 0, dry = 0, quiet = 0, check = 0, graph = 0, standin = 0, rdzv = 0, given[F_COUNT] = { 0 };
    const char *trace = NULL;
    long steps = 1, world = -1, rank = -1, warmup = 5, iters = 20, timeout = 300;
    cp_sim_options opt = { .steps = 1, .pattern = CP_PATTERN_UNIQUE };
    int only[MAX_ONLY];
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
        else if (!strcmp(a, "--quiet")) quiet = given[F_QUIET] = 1;
        else if (!strcmp(a, "--check")) check = 1;
        else if (!strcmp(a, "--graph")) graph = given[F_GRAPH] = 1;
        else if (!strcmp(a, "--standin")) standin = given[F_STANDIN] = 1;
        else if (!strcmp(a, "--rendezvous-only")) rdzv = 1;
        else if (!strcmp(a, "--warmup")) {
            if (parse_int(a, next, 0, 1000000, &warmup)) return 2;
            i++, given[F_WARMUP] = 1;
        }
        else if (!strcmp(a, "--iters")) {
            if (parse_int(a, next, 1, 1000000, &iters)) return 2;
            i++, given[F_ITERS] = 1;
        }
        else if (!strcmp(a, "--timeout")) {
            if (parse_int(a, next, 1, 86400, &timeout)) return 2;
            i++, given[F_TIMEOUT] = 1;
        }
        else if (!strcmp(a, "--steps")) {
            if (parse_int(a, next, 1, 1000000, &steps)) return 2;
            i++, given[F_STEPS] = 1;
        }
        else if (!strcmp(a, "--world-size")) { if (parse_int(a, next, 1, 1L << 30, &world)) return 2; i++; }
        else if (!strcmp(a, "--rank")) { if (parse_int(a, next, 0, 1L << 30, &rank)) return 2; i++; }
        else if (!strcmp(a, "--trace")) {
            if (!next) { cp_error("--trace needs a file name"); return 2; }
            trace = next; i++; given[F_TRACE] = 1;
        } else if (!strcmp(a, "--dump")) {
            if (!next) { cp_error("--dump needs a directory"); return 2; }
            opt.dump_dir = next; i++; given[F_DUMP] = 1;
        } else if (!strcmp(a, "--ranks")) {
            int n = parse_ranks(p, next, only);
            if (n < 0) return 2;
            opt.only = only;
            opt.nonly = n;
            i++; given[F_RANKS] = 1;
        } else if (!strcmp(a, "--arith")) {
            if (next && !strcmp(next, "gloo")) opt.arith = CP_ARITH_GLOO;
            else if (next && !strcmp(next, "nccl")) opt.arith = CP_ARITH_NCCL;
            else { cp_error("--arith takes gloo or nccl, got '%s'", next ? next : ""); return 2; }
            i++; given[F_ARITH] = 1;
        } else if (!strcmp(a, "--pattern")) {
            if (next && !strcmp(next, "unique")) opt.pattern = CP_PATTERN_UNIQUE;
            else if (next && !strcmp(next, "oracle")) opt.pattern = CP_PATTERN_ORACLE;
            else { cp_error("--pattern takes unique or oracle, got '%s'", next ? next : ""); return 2; }
            i++; given[F_PATTERN] = 1;
        } else {
            cp_error("unknown option '%s'; see --help", a);
            return 2;
        }
    }
    if (simulate + dry + check + rdzv > 1) {
        cp_error("--simulate, --dry-run, --check and --rendezvous-only are different runs: give one");
        return 2;
    }
    if (opt.dump_dir && !opt.dump_dir[0]) {
        cp_error("--dump needs a directory, got ''");
        return 2;
    }
    if (trace && !trace[0]) {
        cp_error("--trace needs a file name, got ''");
        return 2;
    }
    if (standin && (simulate || check)) {
        cp_error("--standin times one rank with one-rank communicators and cannot be checked; drop "
                 "--check/--simulate or launch all %d ranks", p->world_size);
        return 2;
    }
    unsigned run = simulate ? RUN_SIM : dry ? RUN_DRY : check ? RUN_CHECK : rdzv ? RUN_RDZV : RUN_TIME;
    const char *run_name = simulate ? "--simulate" : dry ? "--dry-run" : check ? "--check" : rdzv ? "--rendezvous-only" :
                           standin ? "--standin" : "a timing run (no --simulate, --dry-run or --check)";
    for (int f = 0; f < F_COUNT; f++)
        if (given[f] && !(FLAG_RUNS[f].runs & run)) {
            cp_error("%s %s; %s would ignore it: drop %s", FLAG_RUNS[f].flag, FLAG_RUNS[f].what, run_name,
                     FLAG_RUNS[f].flag);
            return 2;
        }
    if (check && graph && opt.dump_dir) {
        cp_error("--dump reads every collective's buffers as it runs, which a replayed CUDA graph does not: drop "
                 "--graph or --dump");
        return 2;
    }
    if (simulate || dry) {
        /* No launcher needed: only the flags given are checked against the plan. */
        if (world >= 0 && world != p->world_size) {
            cp_error("world size %ld does not match plan %s (generated for %d ranks): --world-size %ld; pass "
                     "--world-size %d or drop it, or regenerate the plan with world_size = %ld",
                     world, p->name, p->world_size, world, p->world_size, world);
            return 2;
        }
        if (rank >= 0 && rank >= p->world_size) {
            cp_error("rank %ld is outside plan %s's %d ranks (valid: 0..%d): --rank %ld; pass --rank 0..%d", rank,
                     p->name, p->world_size, p->world_size - 1, rank, p->world_size - 1);
            return 2;
        }
        if (!quiet) launcher_note(p, simulate);
        if (dry) { dry_run(p); return 0; }
        opt.steps = (int)steps;
        opt.timeout_s = (double)timeout;
        opt.log = quiet ? NULL : stdout;
        return cp_simulate(p, &opt);
    }
    /* The launch against the plan first (torchrun, Open MPI or Slurm
     * variables, --world-size, --rank), then the NCCL id channel: a launch
     * of the wrong size is named as such, not as a missing address. */
    cp_launch_env env;
    char err[1024];
    if (cp_launch_ranks_from_env(&env, getenv, err, sizeof err) != 0) {
        cp_error("%s", err);
        return 2;
    }
    int launched = strcmp(env.source, "none") != 0;
    if (world >= 0 && world != p->world_size) {
        cp_error("world size %ld does not match plan %s (generated for %d ranks): --world-size %ld; launch %d ranks "
                 "(and pass --world-size %d), or regenerate the plan with world_size = %ld",
                 world, p->name, p->world_size, world, p->world_size, p->world_size, world);
        return 2;
    }
    if (cp_launch_check_plan(&env, p->name, p->world_size, err, sizeof err) != 0) {
        cp_error("%s", err);
        return 2;
    }
    if (rank >= 0 && rank >= p->world_size) {
        cp_error("rank %ld is outside plan %s's %d ranks (valid: 0..%d): --rank %ld; pass --rank 0..%d", rank,
                 p->name, p->world_size, p->world_size - 1, rank, p->world_size - 1);
        return 2;
    }
    if (rank >= 0 && launched && !standin && rank != env.rank) {
        cp_error("--rank %ld but %s started this process as rank %d; drop --rank (the launcher's rank is used)", rank,
                 env.source, env.rank);
        return 2;
    }
    if (cp_launch_channel_from_env(&env, getenv, err, sizeof err) != 0) {
        cp_error("%s", err);
        return 2;
    }
    if (launched && rank < 0) rank = env.rank;
    if (rdzv) {
        if (!launched && p->world_size > 1) {
            cp_error("--rendezvous-only needs the launcher's variables: start the %d ranks with torchrun (e.g. torchrun "
                     "--standalone --nproc-per-node %d --no-python %s --rendezvous-only), srun or mpirun",
                     p->world_size, p->world_size, argv[0]);
            return 2;
        }
        return rendezvous_only(p, &env, quiet);
    }
    if (standin) {
        env.standin = 1;
        env.world_size = p->world_size;
        env.rank = rank >= 0 ? (int)rank : 0;
        if (!launched) env.local_rank = 0;
        env.comm_id[0] = '\0';
    }
    {
        /* A trace that cannot be written is named before the GPU run, not after it. */
        if (trace && cp_out_check_path(trace, err, sizeof err) != 0) {
            cp_error("--trace %s; give a file in an existing directory", err);
            return 2;
        }
#ifdef CP_WITH_GPU
        /* NCCL reads NCCL_COMM_ID from the environment: set or unset here,
         * before CUDA or NCCL start threads (the library only checks it). */
        if (cp_launch_export_comm_id(&env, err, sizeof err) != 0) {
            cp_error("rank %d: %s", env.rank, err);
            return 2;
        }
        cp_gpu_run_options go = { .check = check, .graph = graph, .steps = (int)steps, .warmup = (int)warmup,
                                  .iters = (int)iters, .timeout_s = (double)timeout, .pattern = opt.pattern,
                                  .dump_dir = opt.dump_dir, .quiet = quiet, .trace_file = trace };
        return cp_gpu_run(p, &CP_KERNELS, &env, &go);
#else
        (void)check; (void)graph; (void)warmup; (void)iters; (void)timeout;
        cp_error("this build has no GPU backend (nvcc was not found at build time); use --simulate or --dry-run, or "
                 "rebuild where CUDA is installed");
        return 2;
#endif
    }
}

/* COMMPLAN_CURSOR_DUMP=PREFIX: every rank's cursor of this process (its
 * step and op) into PREFIX<pid> on SIGUSR1 and on the job's first failure
 * or timeout (cp_cursor_install, cp_cursor_dump; read by python -m
 * commplan diagnose DIR PLAN, docs/diagnosis.md). */
int main(int argc, char **argv)
{
    if (cp_cursor_install() != 0)
        cp_error("COMMPLAN_CURSOR_DUMP: a path of at most 4000 bytes; no cursor will be written");
    int rc = run(argc, argv);
    /* Every line this program printed must have reached its reader: a full
     * disk or a closed pipe is an error, as coreutils' close_stdout. */
    char err[256];
    if (cp_close_stream(stdout, err, sizeof err) != 0) {
        cp_error("cannot write standard output: %s; free space where it goes, or redirect it elsewhere", err);
        if (rc == 0) rc = 2;
    }
    return rc;
}
