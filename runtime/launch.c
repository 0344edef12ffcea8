/* Launcher environment. torchrun's variables win over Open MPI's, which win
 * over Slurm's (srun may wrap either). A launcher whose variables are only
 * partly set is an error, not a silent single-process run. Then the channel
 * for NCCL's unique id: the user's NCCL_COMM_ID, a shared file, torchrun's
 * own store, or MASTER_ADDR:MASTER_PORT (see launch.h). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "launch.h"
#include "safeio.h"

typedef struct {
    const char *source, *rank, *world, *local_rank;
} launcher;

static const launcher LAUNCHERS[] = {
    { "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK" },
    { "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK" },
    { "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID" },
};

static int parse(cp_getenv_fn get, const char *name, int min, int *out, char *err, size_t errlen)
{
    const char *s = get(name);
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < min || v > INT_MAX) {
        snprintf(err, errlen, "$%s=%s is not an integer >= %d; check the launcher's environment", name,
                 s ? s : "(unset)", min);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_port(cp_getenv_fn get, int *port, char *err, size_t errlen)
{
    if (parse(get, "MASTER_PORT", 1, port, err, errlen)) return -1;
    if (*port > 65535) {
        snprintf(err, errlen, "$MASTER_PORT=%d is not a TCP port (1..65535)", *port);
        return -1;
    }
    return 0;
}

static const char *nonempty(cp_getenv_fn get, const char *name)
{
    const char *s = get(name);
    return s && *s ? s : NULL;
}

/* Tags go into a file's header lines and the store's key: printable, no spaces. */
static int printable(const char *s)
{
    for (; *s; s++)
        if (*s < 0x21 || *s > 0x7e) return 0;
    return 1;
}

/* Appends one part to a comma-separated tag; -1 when it no longer fits. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int tag_append(char *out, size_t n, const char *fmt, ...)
{
    size_t used = strlen(out);
    if (used && used + 1 < n) out[used++] = ',', out[used] = '\0';
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(out + used, n - used, fmt, ap);
    va_end(ap);
    return w < 0 || (size_t)w >= n - used ? -1 : 0;
}

/* The id file must name the launch it belongs to, or rank 1 could read the
 * id a crashed earlier job left at the same path: every job id the launchers
 * set goes into the tag (a requeued Slurm job keeps its id but counts
 * restarts; torchrun's restarts keep the run id). torchrun's default run id
 * "none" is the same for every launch, so it alone does not count. */
static int file_job_tag(cp_getenv_fn get, char *out, size_t n, char *err, size_t errlen)
{
    const char *gen = nonempty(get, "COMMPLAN_ID_GENERATION"), *slurm = nonempty(get, "SLURM_JOB_ID");
    const char *step = nonempty(get, "SLURM_STEP_ID"), *requeue = nonempty(get, "SLURM_RESTART_COUNT");
    const char *run = nonempty(get, "TORCHELASTIC_RUN_ID"), *restart = nonempty(get, "TORCHELASTIC_RESTART_COUNT");
    const char *ompi = nonempty(get, "OMPI_MCA_ess_base_jobid"), *pmix = nonempty(get, "PMIX_NAMESPACE");
    if (!gen && !slurm && !(run && strcmp(run, "none") != 0) && !ompi && !pmix) {
        snprintf(err, errlen, "COMMPLAN_ID_FILE is set but no job id tells this launch from an earlier one (no "
                 "SLURM_JOB_ID, OMPI_MCA_ess_base_jobid or PMIX_NAMESPACE, and TORCHELASTIC_RUN_ID is %s); set "
                 "COMMPLAN_ID_GENERATION to a value unique to this launch on every rank (or torchrun --rdzv-id)",
                 run ? "torchrun's default 'none', the same for every launch" : "unset");
        return -1;
    }
    out[0] = '\0';
    int fits = (!gen || !tag_append(out, n, "gen:%s", gen)) &&
               (!slurm || !tag_append(out, n, "slurm:%s.%s%s%s", slurm, step ? step : "-", requeue ? ".r" : "",
                                      requeue ? requeue : "")) &&
               (!run || !tag_append(out, n, "torchrun:%s/%s", run, restart ? restart : "0")) &&
               (!ompi || !tag_append(out, n, "openmpi:%s", ompi)) && (!pmix || !tag_append(out, n, "pmix:%s", pmix));
    if (!fits || !printable(out)) {
        snprintf(err, errlen, "the job ids for COMMPLAN_ID_FILE (%.60s...) are longer than %zu characters or hold "
                 "spaces; set COMMPLAN_ID_GENERATION to a short unique word and unset the others", out, n - 1);
        return -1;
    }
    return 0;
}

static int is_true(const char *s) { return s && (!strcasecmp(s, "true") || !strcmp(s, "1")); }

static int choose_id_channel(cp_launch_env *out, cp_getenv_fn get, char *err, size_t errlen)
{
    const char *id = nonempty(get, "NCCL_COMM_ID"), *file = get("COMMPLAN_ID_FILE");
    const char *addr = nonempty(get, "MASTER_ADDR"), *port = nonempty(get, "MASTER_PORT");
    const char *agent_store = get("TORCHELASTIC_USE_AGENT_STORE");
    if (id) {
        if (strlen(id) >= sizeof out->comm_id) {
            snprintf(err, errlen, "$NCCL_COMM_ID is longer than %zu characters; use host:port", sizeof out->comm_id - 1);
            return -1;
        }
        snprintf(out->comm_id, sizeof out->comm_id, "%s", id);
        out->id_channel = CP_ID_NCCL_COMM_ID;
        return 0;
    }
    if (file) {
        if (!*file || strlen(file) >= sizeof out->id_file) {
            snprintf(err, errlen, "$COMMPLAN_ID_FILE must be a path of 1..%zu characters on a filesystem every rank "
                     "shares", sizeof out->id_file - 1);
            return -1;
        }
        snprintf(out->id_file, sizeof out->id_file, "%s", file);
        out->id_channel = CP_ID_FILE;
        /* A FIFO there would hang a reader's open(), a device never ends, a
         * directory cannot be replaced: named now, before any rank waits (the
         * rendezvous refuses them too, should one appear later). */
        struct stat st;
        if (stat(file, &st) == 0 && !S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "$COMMPLAN_ID_FILE=%s is %s, not a regular file; point it at a file's path on a "
                     "filesystem every rank shares (rank 0 writes the file there)", file, cp_file_kind(st.st_mode));
            return -1;
        }
        if (file_job_tag(get, out->job_tag, sizeof out->job_tag, err, errlen)) return -1;
        /* The file is this job's own, beside the path given: two jobs that
         * share COMMPLAN_ID_FILE (a setting in every job's environment) would
         * otherwise rename over each other's id and both time out. */
        uint64_t h = 1469598103934665603ULL; /* FNV-1a of the job tag */
        for (const char *c = out->job_tag; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        int w = snprintf(out->id_file, sizeof out->id_file, "%s.%016llx", file, (unsigned long long)h);
        if (w < 0 || (size_t)w >= sizeof out->id_file) {
            snprintf(err, errlen, "$COMMPLAN_ID_FILE must be a path of 1..%zu characters on a filesystem every rank "
                     "shares", sizeof out->id_file - 18);
            return -1;
        }
        if (stat(out->id_file, &st) == 0 && !S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "%s (this job's COMMPLAN_ID_FILE) is %s, not a regular file; remove it or point "
                     "COMMPLAN_ID_FILE elsewhere", out->id_file, cp_file_kind(st.st_mode));
            return -1;
        }
        return 0;
    }
    if (is_true(agent_store)) {
        /* torchrun's agent already listens on MASTER_PORT: talk to it as a
         * store client instead of letting NCCL's rank 0 bind that port. */
        if (!addr || !port) {
            snprintf(err, errlen, "TORCHELASTIC_USE_AGENT_STORE=%s but MASTER_ADDR or MASTER_PORT is unset; launch "
                     "with torchrun, or set COMMPLAN_ID_FILE=/shared/path", agent_store);
            return -1;
        }
        if (strlen(addr) >= sizeof out->store_host) {
            snprintf(err, errlen, "$MASTER_ADDR is longer than %zu characters", sizeof out->store_host - 1);
            return -1;
        }
        if (parse_port(get, &out->store_port, err, errlen)) return -1;
        snprintf(out->store_host, sizeof out->store_host, "%s", addr);
        const char *run = nonempty(get, "TORCHELASTIC_RUN_ID"), *restart = nonempty(get, "TORCHELASTIC_RESTART_COUNT");
        int w = snprintf(out->job_tag, sizeof out->job_tag, "%s/%s", run ? run : "none", restart ? restart : "0");
        if (w < 0 || (size_t)w >= sizeof out->job_tag || !printable(out->job_tag)) {
            snprintf(err, errlen, "$TORCHELASTIC_RUN_ID is longer than %zu characters or holds spaces; pass torchrun "
                     "a shorter --rdzv-id", sizeof out->job_tag - 24);
            return -1;
        }
        out->id_channel = CP_ID_TCPSTORE;
        return 0;
    }
    if (addr && port) {
        int p;
        if (parse_port(get, &p, err, errlen)) return -1;
        /* An IPv6 literal needs brackets before the port. */
        int v6 = strchr(addr, ':') != NULL && addr[0] != '[';
        int w = snprintf(out->comm_id, sizeof out->comm_id, v6 ? "[%s]:%d" : "%s:%d", addr, p);
        if (w < 0 || (size_t)w >= sizeof out->comm_id) {
            snprintf(err, errlen, "$MASTER_ADDR is longer than %zu characters", sizeof out->comm_id - 10);
            return -1;
        }
        out->id_channel = CP_ID_MASTER_ADDR;
        return 0;
    }
    if (out->world_size > 1) {
        snprintf(err, errlen, "%d ranks but no rendezvous address: set MASTER_ADDR and MASTER_PORT (torchrun sets "
                 "them), COMMPLAN_ID_FILE=/shared/path or NCCL_COMM_ID=host:port", out->world_size);
        return -1;
    }
    out->id_channel = CP_ID_ALONE;
    return 0;
}

int cp_launch_ranks_from_env(cp_launch_env *out, cp_getenv_fn get, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->world_size = 1;
    out->source = "none";
    for (size_t i = 0; i < sizeof LAUNCHERS / sizeof LAUNCHERS[0]; i++) {
        const launcher *l = &LAUNCHERS[i];
        const char *names[3] = { l->rank, l->world, l->local_rank };
        int set = 0;
        for (int k = 0; k < 3; k++) set += get(names[k]) != NULL;
        if (set == 0) continue;
        if (set < 3) {
            for (int k = 0; k < 3; k++)
                if (!get(names[k])) {
                    snprintf(err, errlen, "$%s is unset but other %s variables are set; launch with %s or set %s, "
                             "%s and %s", names[k], l->source, l->source, l->rank, l->world, l->local_rank);
                    return -1;
                }
        }
        if (parse(get, l->rank, 0, &out->rank, err, errlen) || parse(get, l->world, 1, &out->world_size, err, errlen) ||
            parse(get, l->local_rank, 0, &out->local_rank, err, errlen))
            return -1;
        if (out->rank >= out->world_size) {
            snprintf(err, errlen, "$%s=%d is outside $%s=%d (valid ranks 0..%d)", l->rank, out->rank, l->world,
                     out->world_size, out->world_size - 1);
            return -1;
        }
        out->source = l->source;
        break;
    }
    out->init_timeout_s = 300.0;
    const char *t = get("COMMPLAN_INIT_TIMEOUT");
    if (t) {
        char *end;
        errno = 0;
        double v = strtod(t, &end);
        if (errno || end == t || *end || !isfinite(v) || v <= 0) {
            snprintf(err, errlen, "$COMMPLAN_INIT_TIMEOUT=%s is not a positive number of seconds", t);
            return -1;
        }
        out->init_timeout_s = v;
    }
    return 0;
}

int cp_launch_channel_from_env(cp_launch_env *out, cp_getenv_fn get, char *err, size_t errlen)
{
    return choose_id_channel(out, get, err, errlen);
}

int cp_launch_from_env(cp_launch_env *out, cp_getenv_fn get, char *err, size_t errlen)
{
    if (cp_launch_ranks_from_env(out, get, err, errlen) != 0) return -1;
    return cp_launch_channel_from_env(out, get, err, errlen);
}

int cp_launch_check_plan(const cp_launch_env *env, const char *plan_name, int plan_world, char *err, size_t errlen)
{
    const launcher *l = NULL;
    for (size_t i = 0; i < sizeof LAUNCHERS / sizeof LAUNCHERS[0]; i++)
        if (!strcmp(env->source, LAUNCHERS[i].source)) l = &LAUNCHERS[i];
    if (!l) return 0; /* one process, no launcher: nothing to compare */
    if (env->world_size != plan_world) {
        char how[96]; /* how this launcher is told the number of ranks */
        if (!strcmp(l->source, "torchrun"))
            snprintf(how, sizeof how, "torchrun --nnodes N --nproc-per-node M with N x M = %d", plan_world);
        else if (!strcmp(l->source, "openmpi")) snprintf(how, sizeof how, "mpirun -np %d", plan_world);
        else snprintf(how, sizeof how, "srun --ntasks %d", plan_world);
        snprintf(err, errlen, "world size %d does not match plan %s (generated for %d ranks): %s set $%s=%d; launch "
                 "%d ranks (%s, so that %s=%d), or regenerate the plan with world_size = %d", env->world_size,
                 plan_name, plan_world, l->source, l->world, env->world_size, plan_world, how, l->world, plan_world,
                 env->world_size);
        return -1;
    }
    return 0; /* the rank was checked against the launcher's world (cp_launch_ranks_from_env) */
}

/* The one decision about NCCL_COMM_ID (launch.h): agree, change it (a
 * program's main), or refuse (a library, which never writes the
 * environment of a running process). */
int cp_comm_id_action(const char *current, const char *wanted, int may_change, char *err, size_t errlen)
{
    if (!wanted) wanted = "";
    if (wanted[0] ? current && !strcmp(current, wanted) : !current) return CP_COMM_ID_KEEP;
    if (may_change) return wanted[0] ? CP_COMM_ID_SET : CP_COMM_ID_UNSET;
    /* The user's value, printable and short, so the line stays one line. */
    char now[120];
    if (!current) snprintf(now, sizeof now, "unset");
    else {
        snprintf(now, sizeof now, "'%.100s%s'", current, strlen(current) > 100 ? "..." : "");
        for (char *c = now; *c; c++)
            if (*c < 0x20 || *c > 0x7e) *c = '?';
    }
    if (wanted[0])
        snprintf(err, errlen, "NCCL_COMM_ID is %s but this launch bootstraps NCCL at %s, which NCCL reads from the "
                 "environment; a library never changes the environment of a running process (other threads read it): "
                 "export NCCL_COMM_ID=%s before the process starts", now, wanted, wanted);
    else
        snprintf(err, errlen, "NCCL_COMM_ID is %s but this launch carries NCCL's id itself (COMMPLAN_ID_FILE, "
                 "torchrun's store, one rank or --standin), and NCCL would bootstrap from that value instead; a library "
                 "never changes the environment of a running process (other threads read it): unset NCCL_COMM_ID "
                 "before the process starts", now);
    return -1;
}

const char *cp_launch_comm_id(const cp_launch_env *env) { return env->standin ? "" : env->comm_id; }

int cp_launch_export_comm_id(const cp_launch_env *env, char *err, size_t errlen)
{
    const char *wanted = cp_launch_comm_id(env);
    int a = cp_comm_id_action(getenv("NCCL_COMM_ID"), wanted, 1, err, errlen);
    if ((a == CP_COMM_ID_SET && setenv("NCCL_COMM_ID", wanted, 1) != 0) ||
        (a == CP_COMM_ID_UNSET && unsetenv("NCCL_COMM_ID") != 0)) {
        snprintf(err, errlen, "%s NCCL_COMM_ID failed (errno %d); set it in the launcher's environment instead",
                 a == CP_COMM_ID_SET ? "setenv" : "unsetenv", errno);
        return -1;
    }
    return 0;
}
