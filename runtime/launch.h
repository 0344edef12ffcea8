/* Rank, world and local rank from the launcher's environment (torchrun,
 * Slurm, Open MPI), and the channel that carries NCCL's unique id from
 * rank 0 to the other ranks (runtime/rendezvous.h), without MPI. */
#ifndef COMMPLAN_LAUNCH_H
#define COMMPLAN_LAUNCH_H

#include <stddef.h>

typedef char *(*cp_getenv_fn)(const char *name); /* getenv's type */

/* How the 128-byte ncclUniqueId reaches every rank, chosen in this order. */
typedef enum {
    CP_ID_ALONE = 0,     /* one rank: nothing to share */
    CP_ID_NCCL_COMM_ID,  /* NCCL_COMM_ID set by the user: every rank calls ncclGetUniqueId itself */
    CP_ID_FILE,          /* COMMPLAN_ID_FILE: rank 0 writes the id to a file on a shared filesystem */
    CP_ID_TCPSTORE,      /* torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) at MASTER_ADDR:MASTER_PORT */
    CP_ID_MASTER_ADDR,   /* NCCL_COMM_ID=MASTER_ADDR:MASTER_PORT: NCCL's rank 0 listens there itself */
} cp_id_channel;

typedef struct {
    int rank, world_size, local_rank;
    const char *source;  /* "torchrun", "openmpi", "slurm" or "none" (one process) */
    char comm_id[300];   /* NCCL_COMM_ID to set before ncclGetUniqueId ("host:port", "[v6]:port"); "" for the
                            file and store channels, whose rank 0 must not bind a fixed address */
    int standin;         /* 1: this process plays `rank` of the plan alone on one GPU; every group's
                            communicator has one rank, so each collective is issued with the plan's
                            counts but moves only this rank's own slot (host-cost measurement) */
    int id_channel;         /* cp_id_channel */
    char store_host[256];   /* CP_ID_TCPSTORE: MASTER_ADDR */
    int store_port;         /* CP_ID_TCPSTORE: MASTER_PORT */
    char id_file[4096];     /* CP_ID_FILE: COMMPLAN_ID_FILE */
    char job_tag[256];      /* which launch this is: for CP_ID_FILE the job id written into and checked in the
                               file; for CP_ID_TCPSTORE "<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>" */
    double init_timeout_s;  /* COMMPLAN_INIT_TIMEOUT, default 300: bootstrap limit */
} cp_launch_env;

/* Returns 0, or -1 with a one-line message naming the variable and the fix
 * in err. getenv_fn is getenv in programs, a table lookup in tests. */
int cp_launch_from_env(cp_launch_env *out, cp_getenv_fn getenv_fn, char *err, size_t errlen);
/* cp_launch_from_env in two steps, so a program can compare the launch
 * with its plan (cp_launch_check_plan) before the channel is chosen: first
 * rank, world, local rank and COMMPLAN_INIT_TIMEOUT, then the NCCL id
 * channel. Same returns. */
int cp_launch_ranks_from_env(cp_launch_env *out, cp_getenv_fn getenv_fn, char *err, size_t errlen);
int cp_launch_channel_from_env(cp_launch_env *out, cp_getenv_fn getenv_fn, char *err, size_t errlen);
/* NCCL reads NCCL_COMM_ID from the environment, so the launch may need it
 * set (env->comm_id: NCCL's own bootstrap) or unset ("": the id travels
 * through rendezvous.c and NCCL's rank 0 must not bind a fixed address).
 * setenv and unsetenv race with getenv in other threads (undefined in
 * glibc), so only a program's main, before any thread starts, changes it;
 * a library (loaded by PyTorch, whose threads read the environment) only
 * checks it.
 * cp_comm_id_action: given the variable's current value (NULL: unset) and the
 * wanted one ("": unset), CP_COMM_ID_KEEP when they agree, else with
 * may_change CP_COMM_ID_SET or CP_COMM_ID_UNSET, without it -1 and one line
 * in err saying what to export or unset before the process starts. Pure. */
enum { CP_COMM_ID_KEEP = 0, CP_COMM_ID_SET = 1, CP_COMM_ID_UNSET = 2 };
int cp_comm_id_action(const char *current, const char *wanted, int may_change, char *err, size_t errlen);
/* The value env needs NCCL_COMM_ID to have: env->comm_id, or "" (unset) for
 * a stand-in run and for the file and store channels. */
const char *cp_launch_comm_id(const cp_launch_env *env);
/* Makes the environment agree with env (setenv / unsetenv NCCL_COMM_ID).
 * For a program's main only, before it starts any thread (CUDA's and NCCL's
 * included: call it before the first CUDA call); 0 or -1 with err. */
int cp_launch_export_comm_id(const cp_launch_env *env, char *err, size_t errlen);

/* 0 when the launcher's world is the plan's (or there is no launcher); else
 * -1 with one line naming the launcher's variable, both numbers and the fix. */
int cp_launch_check_plan(const cp_launch_env *env, const char *plan_name, int plan_world, char *err, size_t errlen);

#endif
