/* Tests of a job that must stop, not hang: rank threads joined within a
 * limit (a rank still blocked then fails the test instead of hanging the
 * suite), and cp_simulate run the same way with its stderr captured.
 * Needs _GNU_SOURCE (pthread_timedjoin_np), cmocka.h and simulate.h first. */
#ifndef COMMPLAN_TEST_BOUNDED_H
#define COMMPLAN_TEST_BOUNDED_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Seconds since t0 (CLOCK_MONOTONIC). */
static inline double since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

/* Joins the rank threads, failing (not hanging) when any is still blocked
 * after limit_s: a rank that waits forever for a stopped peer is the bug. */
static inline void join_bounded(pthread_t *first, size_t stride, int n, double limit_s)
{
    struct timespec until; /* pthread_timedjoin_np's deadline is on the wall clock */
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)limit_s;
    for (int r = 0; r < n; r++) {
        int e = pthread_timedjoin_np(*(pthread_t *)((char *)first + (size_t)r * stride), NULL, &until);
        if (e) fail_msg("rank %d still blocked after %.0f s: a failure on one rank did not stop it", r, limit_s);
    }
}

/* cp_simulate (the binary's --simulate) with its stderr in a file, on a
 * thread joined within limit_s: its return, its seconds, what it printed. */
typedef struct {
    const cp_plan *plan;
    const cp_sim_options *opt;
    int rc;
} sim_job;

static inline void *sim_thread(void *arg)
{
    sim_job *j = arg;
    j->rc = cp_simulate(j->plan, j->opt);
    return NULL;
}

static inline int simulate_captured(const cp_plan *p, const cp_sim_options *opt, double limit_s, double *secs, char *out,
                             size_t outlen)
{
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), 2) >= 0);
    sim_job j = { .plan = p, .opt = opt, .rc = -1 };
    pthread_t th;
    struct timespec t0, until;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)limit_s;
    assert_int_equal(pthread_create(&th, NULL, sim_thread, &j), 0);
    int late = pthread_timedjoin_np(th, NULL, &until);
    *secs = since(&t0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    if (late) fail_msg("--simulate still running after %.0f s: a failure on one rank did not stop the others", limit_s);
    rewind(tmp);
    size_t n = fread(out, 1, outlen - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
    return j.rc;
}

#endif
