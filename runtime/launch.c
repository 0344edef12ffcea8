/* Launcher environment. torchrun's variables win over Open MPI's, which win
 * over Slurm's (srun may wrap either). A launcher whose variables are only
 * partly set is an error, not a silent single-process run. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

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

int cp_launch_from_env(cp_launch_env *out, cp_getenv_fn get, char *err, size_t errlen)
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
    const char *id = get("NCCL_COMM_ID"), *addr = get("MASTER_ADDR"), *port = get("MASTER_PORT");
    if (id && *id) {
        snprintf(out->comm_id, sizeof out->comm_id, "%s", id);
    } else if (addr && *addr && port && *port) {
        int p;
        if (parse(get, "MASTER_PORT", 1, &p, err, errlen)) return -1;
        if (p > 65535) {
            snprintf(err, errlen, "$MASTER_PORT=%d is not a TCP port (1..65535)", p);
            return -1;
        }
        /* An IPv6 literal needs brackets before the port. */
        int v6 = strchr(addr, ':') != NULL && addr[0] != '[';
        snprintf(out->comm_id, sizeof out->comm_id, v6 ? "[%s]:%d" : "%s:%d", addr, p);
    } else if (out->world_size > 1) {
        snprintf(err, errlen, "%d ranks but no rendezvous address: set MASTER_ADDR and MASTER_PORT (torchrun sets "
                 "them) or NCCL_COMM_ID=host:port", out->world_size);
        return -1;
    }
    return 0;
}
