/* Host backend: every rank of a plan as a thread of one process over host
 * memory. Collectives rendezvous on a barrier per group instance. */
#ifndef COMMPLAN_HOST_H
#define COMMPLAN_HOST_H

#include "commplan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cp_host_world cp_host_world;

cp_host_world *cp_host_world_create(const cp_plan *p);
void cp_host_world_destroy(cp_host_world *w);
/* Reductions with gloo's arithmetic (the default) or NCCL's (ring order,
 * ncclAvg's premultiply; cp_reduce_values_nccl). */
void cp_host_world_set_arith(cp_host_world *w, cp_arith a);
/* b->ctx is owned by the world; valid until cp_host_world_destroy. */
void cp_host_backend_init(cp_backend *b, cp_host_world *w, int rank);

#ifdef __cplusplus
}
#endif

#endif
