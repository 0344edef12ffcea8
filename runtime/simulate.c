/* The simulation harness: one thread per rank over the host backend.
 * Parameters start from an element-unique pattern (different every step);
 * forward/backward placeholders check that every unsharded parameter is
 * rebuilt exactly and write per-rank gradients; after the step every
 * rank's sharded gradients are compared with an independent emulation of
 * the reduction (sum over the shard group, then the replicate group). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "host.h"
#include "simulate.h"

typedef struct sim_world sim_world;

typedef struct {
    sim_world *sw;
    int rank;
    cp_backend backend;
    cp_executor ex;
    cp_harness harness;
    int error;
    pthread_t thread;
} sim_rank;

struct sim_world {
    const cp_plan *plan;
    const cp_sim_options *opt;
    cp_host_world *host;
    sim_rank *ranks;
};

static void *rank_main(void *arg)
{
    sim_rank *sr = arg;
    const cp_sim_options *opt = sr->sw->opt;
    for (int s = 0; s < opt->steps && !sr->error; s++) {
        if (cp_harness_begin_step(&sr->harness, s) || cp_executor_step(&sr->ex) ||
            cp_harness_end_step(&sr->harness)) {
            sr->error = 1;
            break;
        }
    }
    return NULL;
}

int cp_simulate(const cp_plan *p, const cp_sim_options *opt)
{
    sim_world sw = { .plan = p, .opt = opt };
    int rc = 2;
    sw.host = cp_host_world_create(p);
    sw.ranks = calloc((size_t)p->world_size, sizeof(sim_rank));
    if (!sw.host || !sw.ranks) {
        fprintf(stderr, "commplan: out of host memory setting up %d simulated ranks\n", p->world_size);
        goto out;
    }
    int started = 0;
    for (int r = 0; r < p->world_size; r++) {
        sim_rank *sr = &sw.ranks[r];
        sr->sw = &sw;
        sr->rank = r;
        cp_host_backend_init(&sr->backend, sw.host, r);
        if (cp_executor_init(&sr->ex, p, r, &sr->backend) != 0) goto join;
        if (cp_harness_init(&sr->harness, &sr->ex, opt->pattern) != 0) goto join;
        /* Opened before any thread starts: a rank failing alone would
         * leave its peers waiting in a collective. */
        if (opt->dump_dir && cp_harness_open_dump(&sr->harness, opt->dump_dir) != 0) goto join;
    }
    for (; started < p->world_size; started++) {
        if (pthread_create(&sw.ranks[started].thread, NULL, rank_main, &sw.ranks[started]) != 0) {
            fprintf(stderr, "commplan: cannot start thread for rank %d; lower the plan's world size\n", started);
            /* Ranks already running would wait forever on absent peers. */
            exit(2);
        }
    }
join:
    for (int r = 0; r < started; r++) pthread_join(sw.ranks[r].thread, NULL);
    long bad = 0;
    int err = started < p->world_size;
    for (int r = 0; r < p->world_size; r++) {
        bad += sw.ranks[r].harness.check.mismatches;
        err |= sw.ranks[r].error;
        cp_harness_free(&sw.ranks[r].harness);
        cp_executor_free(&sw.ranks[r].ex);
    }
    if (err) rc = 2;
    else if (bad) {
        fprintf(stderr, "commplan: %s: %ld mismatching elements over %d ranks\n", p->name, bad, p->world_size);
        rc = 1;
    } else {
        if (opt->log)
            fprintf(opt->log, "%s: simulated %d step(s) on %d ranks: all unsharded params and reduced grads exact\n",
                    p->name, opt->steps, p->world_size);
        rc = 0;
    }
out:
    cp_host_world_destroy(sw.host);
    free(sw.ranks);
    return rc;
}
