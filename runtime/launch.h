/* Rank, world and local rank from the launcher's environment (torchrun,
 * Slurm, Open MPI), and NCCL's bootstrap address, without MPI. */
#ifndef COMMPLAN_LAUNCH_H
#define COMMPLAN_LAUNCH_H

#include <stddef.h>

typedef char *(*cp_getenv_fn)(const char *name); /* getenv's type */

typedef struct {
    int rank, world_size, local_rank;
    const char *source;  /* "torchrun", "openmpi", "slurm" or "none" (one process) */
    char comm_id[300];   /* NCCL_COMM_ID value ("host:port", "[v6]:port"), "" if none */
    int standin;         /* 1: this process plays `rank` of the plan alone on one GPU; every group's
                            communicator has one rank, so each collective is issued with the plan's
                            counts but moves only this rank's own slot (host-cost measurement) */
} cp_launch_env;

/* Returns 0, or -1 with a one-line message naming the variable and the fix
 * in err. getenv_fn is getenv in programs, a table lookup in tests. */
int cp_launch_from_env(cp_launch_env *out, cp_getenv_fn getenv_fn, char *err, size_t errlen);

#endif
