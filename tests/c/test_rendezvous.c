/* cmocka tests for the NCCL id channels (runtime/launch.c, runtime/rendezvous.c):
 * which channel each launcher's environment selects, the shared-file channel
 * with 4 ranks as threads (a stale file from another job ignored, the timeout
 * message), and the TCPStore client against tests/fake_tcpstore.py, a Python
 * server of PyTorch's store protocol on a free loopback port. Run from the
 * repository root. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"
#include "rendezvous.h"
#include "fake_env.h"

extern char **environ;

#define FAKE_STORE "tests/fake_tcpstore.py"
enum { ID_BYTES = 128, RANKS = 4 };

/* ---- fake environments ---- */


static double now_s(void)
{
    struct timespec t;
    assert_int_equal(clock_gettime(CLOCK_MONOTONIC, &t), 0);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void test_channel_selection(void **state)
{
    (void)state;
    cp_launch_env L;
    char err[1024];

    /* (a) the user's NCCL_COMM_ID wins over everything else. */
    const char *user_id[] = { "RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", "NCCL_COMM_ID=10.0.0.9:7000",
                              "COMMPLAN_ID_FILE=/shared/id", "SLURM_JOB_ID=5", "MASTER_ADDR=m", "MASTER_PORT=29500",
                              "TORCHELASTIC_USE_AGENT_STORE=True", NULL };
    assert_int_equal(launch(user_id, &L, err), 0);
    assert_int_equal(L.id_channel, CP_ID_NCCL_COMM_ID);
    assert_string_equal(L.comm_id, "10.0.0.9:7000");
    assert_int_equal(cp_rendezvous_share(&L, "fp", (char[ID_BYTES]){ 0 }, ID_BYTES, 1, err, sizeof err),
                     CP_RDZV_NCCL_OWN);

    /* (b) a shared file under Slurm: the job and step name the launch; NCCL_COMM_ID stays unset. */
    const char *slurm_file[] = { "SLURM_PROCID=3", "SLURM_NTASKS=8", "SLURM_LOCALID=3", "SLURM_JOB_ID=4242",
                                 "SLURM_STEP_ID=1", "COMMPLAN_ID_FILE=/shared/run/id", "MASTER_ADDR=m",
                                 "MASTER_PORT=29500", NULL };
    assert_int_equal(launch(slurm_file, &L, err), 0);
    assert_string_equal(L.source, "slurm");
    assert_int_equal(L.id_channel, CP_ID_FILE);
    /* the job's own file beside the path given: ".", 16 hex digits of the job tag */
    assert_int_equal(strncmp(L.id_file, "/shared/run/id.", 15), 0);
    assert_int_equal(strlen(L.id_file), 15 + 16);
    assert_string_equal(L.job_tag, "slurm:4242.1");
    assert_string_equal(L.comm_id, "");
    const char *generation[] = { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_JOB_ID=4242",
                                 "COMMPLAN_ID_FILE=/shared/id", "COMMPLAN_ID_GENERATION=try3", NULL };
    assert_int_equal(launch(generation, &L, err), 0);
    assert_string_equal(L.job_tag, "gen:try3,slurm:4242.-"); /* every job id there is */
    const char *mpi_file[] = { "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                               "COMMPLAN_ID_FILE=/shared/id", "OMPI_MCA_ess_base_jobid=123456", NULL };
    assert_int_equal(launch(mpi_file, &L, err), 0);
    assert_string_equal(L.job_tag, "openmpi:123456");
    /* No job id (torchrun's default run id "none" is the same every time): refused. */
    const char *no_job[] = { "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "COMMPLAN_ID_FILE=/shared/id",
                             "TORCHELASTIC_RUN_ID=none", NULL };
    assert_int_equal(launch(no_job, &L, err), -1);
    assert_non_null(strstr(err, "COMMPLAN_ID_FILE"));
    assert_non_null(strstr(err, "COMMPLAN_ID_GENERATION"));
    const char *spaced[] = { "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "COMMPLAN_ID_FILE=/shared/id",
                             "COMMPLAN_ID_GENERATION=two words", NULL };
    assert_int_equal(launch(spaced, &L, err), -1);
    assert_non_null(strstr(err, "hold spaces"));
    /* A requeued Slurm job keeps its id: the restart count tells it apart; so do torchrun's restarts. */
    const char *requeued[] = { "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "COMMPLAN_ID_FILE=/shared/id",
                               "SLURM_JOB_ID=9", "SLURM_STEP_ID=0", "SLURM_RESTART_COUNT=2", "TORCHELASTIC_RUN_ID=none",
                               "TORCHELASTIC_RESTART_COUNT=1", NULL };
    assert_int_equal(launch(requeued, &L, err), 0);
    assert_string_equal(L.job_tag, "slurm:9.0.r2,torchrun:none/1");

    /* (c) torchrun with its agent store on MASTER_PORT. */
    const char *torchrun[] = { "RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=2", "MASTER_ADDR=node1", "MASTER_PORT=29400",
                               "TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RUN_ID=abc-1",
                               "TORCHELASTIC_RESTART_COUNT=2", NULL };
    assert_int_equal(launch(torchrun, &L, err), 0);
    assert_int_equal(L.id_channel, CP_ID_TCPSTORE);
    assert_string_equal(L.store_host, "node1");
    assert_int_equal(L.store_port, 29400);
    assert_string_equal(L.job_tag, "abc-1/2");
    assert_string_equal(L.comm_id, "");
    const char *store_no_port[] = { "RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=0", "MASTER_ADDR=node1",
                                    "TORCHELASTIC_USE_AGENT_STORE=True", NULL };
    assert_int_equal(launch(store_no_port, &L, err), -1);
    assert_non_null(strstr(err, "TORCHELASTIC_USE_AGENT_STORE"));

    /* (d) srun/mpirun with MASTER_ADDR/MASTER_PORT exported and no store there. */
    const char *exported[] = { "RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=0", "MASTER_ADDR=fe80::1", "MASTER_PORT=1234",
                               "TORCHELASTIC_USE_AGENT_STORE=False", NULL };
    assert_int_equal(launch(exported, &L, err), 0);
    assert_int_equal(L.id_channel, CP_ID_MASTER_ADDR);
    assert_string_equal(L.comm_id, "[fe80::1]:1234");
    assert_int_equal(cp_rendezvous_share(&L, "fp", (char[ID_BYTES]){ 0 }, ID_BYTES, 1, err, sizeof err),
                     CP_RDZV_NCCL_OWN);

    /* One process: nothing to share. */
    const char *alone[] = { NULL };
    assert_int_equal(launch(alone, &L, err), 0);
    assert_int_equal(L.id_channel, CP_ID_ALONE);
    assert_true(L.init_timeout_s == 300.0);
    assert_int_equal(cp_rendezvous_share(&L, "fp", (char[ID_BYTES]){ 0 }, ID_BYTES, 1, err, sizeof err),
                     CP_RDZV_SHARED);
    const char *none[] = { "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL };
    assert_int_equal(launch(none, &L, err), -1);
    assert_non_null(strstr(err, "COMMPLAN_ID_FILE"));
    assert_non_null(strstr(err, "set MASTER_ADDR and MASTER_PORT"));

    /* COMMPLAN_INIT_TIMEOUT bounds every wait. */
    const char *timeout[] = { "COMMPLAN_INIT_TIMEOUT=2.5", NULL };
    assert_int_equal(launch(timeout, &L, err), 0);
    assert_true(L.init_timeout_s == 2.5);
    const char *bad_timeout[] = { "COMMPLAN_INIT_TIMEOUT=soon", NULL };
    assert_int_equal(launch(bad_timeout, &L, err), -1);
    assert_non_null(strstr(err, "$COMMPLAN_INIT_TIMEOUT=soon"));

    /* A key with a space could not be told apart in the file or the store. */
    assert_int_equal(launch(slurm_file, &L, err), 0);
    assert_int_equal(cp_rendezvous_share(&L, "two words", (char[ID_BYTES]){ 0 }, ID_BYTES, 1, err, sizeof err),
                     CP_RDZV_ERROR);
    assert_non_null(strstr(err, "rank 3"));
}

/* NCCL_COMM_ID: the binary's main may set or unset it before any thread
 * starts; the library (in PyTorch's process) only checks it and refuses an
 * environment that disagrees with one line saying what to do. */
static void test_comm_id_action(void **state)
{
    (void)state;
    char err[1024];
    const char *want = "10.0.0.1:29500";
    /* Agreeing: nothing to do, in either mode. */
    assert_int_equal(cp_comm_id_action(want, want, 0, err, sizeof err), CP_COMM_ID_KEEP);
    assert_int_equal(cp_comm_id_action(NULL, "", 0, err, sizeof err), CP_COMM_ID_KEEP);
    assert_int_equal(cp_comm_id_action(NULL, NULL, 1, err, sizeof err), CP_COMM_ID_KEEP);
    /* The binary changes it. */
    assert_int_equal(cp_comm_id_action(NULL, want, 1, err, sizeof err), CP_COMM_ID_SET);
    assert_int_equal(cp_comm_id_action("10.0.0.2:1", want, 1, err, sizeof err), CP_COMM_ID_SET);
    assert_int_equal(cp_comm_id_action(want, "", 1, err, sizeof err), CP_COMM_ID_UNSET);
    assert_int_equal(cp_comm_id_action("", "", 1, err, sizeof err), CP_COMM_ID_UNSET); /* NCCL reads "" as set */
    /* The library refuses, naming the value to export. */
    assert_int_equal(cp_comm_id_action(NULL, want, 0, err, sizeof err), -1);
    assert_null(strchr(err, '\n'));
    assert_non_null(strstr(err, "NCCL_COMM_ID is unset"));
    assert_non_null(strstr(err, "export NCCL_COMM_ID=10.0.0.1:29500 before the process starts"));
    assert_int_equal(cp_comm_id_action("10.0.0.2:1", want, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "NCCL_COMM_ID is '10.0.0.2:1'"));
    /* ... or the value to unset, printed as one line whatever it holds. */
    assert_int_equal(cp_comm_id_action("a\nb", "", 0, err, sizeof err), -1);
    assert_null(strchr(err, '\n'));
    assert_non_null(strstr(err, "NCCL_COMM_ID is 'a?b'"));
    assert_non_null(strstr(err, "unset NCCL_COMM_ID before the process starts"));
    assert_int_equal(cp_comm_id_action("", "", 0, err, sizeof err), -1);

    /* What each launch wants: the MASTER_ADDR channel its address, the file
     * channel and a stand-in run nothing. */
    cp_launch_env L;
    const char *exported[] = { "RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=0", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500",
                               NULL };
    assert_int_equal(launch(exported, &L, err), 0);
    assert_string_equal(cp_launch_comm_id(&L), want);
    L.standin = 1;
    assert_string_equal(cp_launch_comm_id(&L), "");
    const char *file[] = { "RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=0", "COMMPLAN_ID_FILE=/shared/id",
                           "COMMPLAN_ID_GENERATION=g", NULL };
    assert_int_equal(launch(file, &L, err), 0);
    assert_string_equal(cp_launch_comm_id(&L), "");

    /* The binary's export, on this process's own environment (the test is
     * single-threaded here): set, then unset. */
    assert_int_equal(launch(exported, &L, err), 0);
    assert_int_equal(cp_launch_export_comm_id(&L, err, sizeof err), 0);
    assert_string_equal(getenv("NCCL_COMM_ID"), want);
    assert_int_equal(launch(file, &L, err), 0);
    assert_int_equal(cp_launch_export_comm_id(&L, err, sizeof err), 0);
    assert_null(getenv("NCCL_COMM_ID"));
}

/* ---- ranks as threads ---- */

typedef struct {
    cp_launch_env env;
    const char *key, *plan; /* plan: NULL for cp_rendezvous_share, else cp_rendezvous_share_plan's name */
    double timeout_s, start_delay_s;
    long long launch;
    int confirm; /* then cp_rendezvous_confirm, as --rendezvous-only does */
    unsigned char bytes[ID_BYTES];
    int rc;
    double seconds;
    char err[1024];
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    if (j->start_delay_s > 0) {
        struct timespec t = { 0, (long)(j->start_delay_s * 1e9) };
        nanosleep(&t, NULL);
    }
    double t0 = now_s();
    if (j->plan) {
        cp_rendezvous_info info = { -1 };
        j->rc = cp_rendezvous_share_plan(&j->env, j->plan, j->key, j->bytes, sizeof j->bytes, j->timeout_s, &info,
                                         j->err, sizeof j->err);
        j->launch = info.launch;
    } else
        j->rc = cp_rendezvous_share(&j->env, j->key, j->bytes, sizeof j->bytes, j->timeout_s, j->err, sizeof j->err);
    if (j->rc == CP_RDZV_SHARED && j->confirm &&
        cp_rendezvous_confirm(&j->env, j->key, j->bytes, sizeof j->bytes, j->timeout_s, j->err, sizeof j->err) != 0)
        j->rc = CP_RDZV_ERROR;
    j->seconds = now_s() - t0;
    return NULL;
}

static int confirm_runs; /* start_ranks: every rank confirms after its rendezvous */

static void fill_id(unsigned char *b, int seed)
{
    for (int i = 0; i < ID_BYTES; i++) b[i] = (unsigned char)(seed * 31 + i * 7);
}

/* Ranks 1..3 start first and wait; rank 0 publishes a moment later.
 * keys[r] (NULL: key) and plans[r] (NULL: none) per rank; started only. */
static void start_ranks(rank_job *jobs, const char *const *base_env, const char *key, const char *const *keys,
                        const char *const *plans, int seed)
{
    pthread_t th[RANKS];
    for (int r = 0; r < RANKS; r++) {
        char rank_var[32], err[1024];
        snprintf(rank_var, sizeof rank_var, "RANK=%d", r);
        const char *env[32];
        int n = 0;
        env[n++] = rank_var;
        for (const char *const *e = base_env; *e && n < 31; e++) env[n++] = *e;
        env[n] = NULL;
        memset(&jobs[r], 0, sizeof jobs[r]);
        assert_int_equal(launch(env, &jobs[r].env, err), 0);
        jobs[r].key = keys && keys[r] ? keys[r] : key;
        jobs[r].plan = plans ? plans[r] : NULL;
        jobs[r].confirm = confirm_runs;
        jobs[r].timeout_s = 20;
        jobs[r].start_delay_s = r == 0 ? 0.2 : 0;
        if (r == 0) fill_id(jobs[r].bytes, seed);
        else memset(jobs[r].bytes, 0xee, ID_BYTES);
    }
    for (int r = RANKS - 1; r >= 0; r--) assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    for (int r = 0; r < RANKS; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
}

/* Every rank gets rank 0's bytes (fill_id(seed)). */
static void run_ranks_seed(rank_job *jobs, const char *const *base_env, const char *key, int seed)
{
    start_ranks(jobs, base_env, key, NULL, NULL, seed);
    unsigned char want[ID_BYTES];
    fill_id(want, seed);
    for (int r = 0; r < RANKS; r++) {
        if (jobs[r].rc != CP_RDZV_SHARED) fail_msg("rank %d: %s", r, jobs[r].err);
        assert_memory_equal(jobs[r].bytes, want, ID_BYTES);
    }
}

static void run_ranks(rank_job *jobs, const char *const *base_env, const char *key)
{
    run_ranks_seed(jobs, base_env, key, 5);
}

/* ---- COMMPLAN_ID_FILE ---- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

static char *read_text(const char *path)
{
    static char text[8192];
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    assert_int_equal(fclose(f), 0);
    text[n] = '\0';
    return text;
}

/* A stale file of an earlier job with the same plan sits at the path; a
 * well-formed one, so only the job tag tells it apart. */
static const char STALE[] = "commplan-nccl-id 1\njob gen:old-job\nkey fp1234\nbytes 128\n"
                            "0000000000000000000000000000000000000000000000000000000000000000"
                            "0000000000000000000000000000000000000000000000000000000000000000"
                            "0000000000000000000000000000000000000000000000000000000000000000"
                            "0000000000000000000000000000000000000000000000000000000000000000\n";

/* The file a launch with env (RANK=0 added) reads and writes: launch.c's job-specific name. */
static void job_path(const char *const *env, char *out, size_t n)
{
    const char *e[32];
    int k = 0;
    e[k++] = "RANK=0";
    for (int i = 0; env[i] && k < 31; i++) e[k++] = env[i];
    e[k] = NULL;
    cp_launch_env L;
    char err[1024];
    assert_int_equal(launch(e, &L, err), 0);
    snprintf(out, n, "%s", L.id_file);
}

static void test_id_file_four_ranks(void **state)
{
    (void)state;
    char dir[] = "/tmp/commplan-rdzv-XXXXXX", path[256], file_var[300], jpath[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/nccl.id", dir);
    snprintf(file_var, sizeof file_var, "COMMPLAN_ID_FILE=%s", path);
    const char *env[] = { "WORLD_SIZE=4", "LOCAL_RANK=0", file_var, "COMMPLAN_ID_GENERATION=new-job", NULL };
    job_path(env, jpath, sizeof jpath);
    write_text(jpath, STALE);
    rank_job jobs[RANKS];
    run_ranks(jobs, env, "fp1234");
    const char *text = read_text(jpath);
    assert_non_null(strstr(text, "job gen:new-job\nkey fp1234\nbytes 128\n"));
    /* Only the file itself is left: the temporary name was renamed over it. */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "test \"$(ls %s | wc -l)\" = 1", dir);
    assert_int_equal(system(cmd), 0);

    /* A later launch of another plan at the same path does not take this id. */
    const char *other_plan[] = { "RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=0", file_var, "COMMPLAN_ID_GENERATION=new-job",
                                 NULL };
    rank_job j;
    memset(&j, 0, sizeof j);
    char err[1024];
    assert_int_equal(launch(other_plan, &j.env, err), 0);
    j.key = "fp9999";
    j.timeout_s = 0.3;
    rank_main(&j);
    assert_int_equal(j.rc, CP_RDZV_ERROR);
    assert_non_null(strstr(j.err, "plan fp1234: stale"));

    /* Another job given the same COMMPLAN_ID_FILE writes a file of its own beside it. */
    const char *other_job[] = { "WORLD_SIZE=4", "LOCAL_RANK=0", file_var, "COMMPLAN_ID_GENERATION=other-job", NULL };
    char opath[4200];
    job_path(other_job, opath, sizeof opath);
    assert_string_not_equal(opath, jpath);
    run_ranks(jobs, other_job, "fp1234");
    assert_non_null(strstr(read_text(jpath), "job gen:new-job\n"));
    assert_non_null(strstr(read_text(opath), "job gen:other-job\n"));

    assert_int_equal(unlink(jpath), 0);
    assert_int_equal(unlink(opath), 0);
    assert_int_equal(rmdir(dir), 0);
}

static void test_id_file_timeout(void **state)
{
    (void)state;
    char dir[] = "/tmp/commplan-rdzv-XXXXXX", path[256], file_var[300], err[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/nccl.id", dir);
    snprintf(file_var, sizeof file_var, "COMMPLAN_ID_FILE=%s", path);
    const char *env[] = { "SLURM_PROCID=2", "SLURM_NTASKS=4", "SLURM_LOCALID=2", "SLURM_JOB_ID=77", file_var, NULL };
    rank_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(launch(env, &j.env, err), 0);
    j.key = "fp1234";
    j.timeout_s = 0.4;

    /* Nothing there: one line naming the variable, the rank and the fix, on time. */
    rank_main(&j);
    assert_int_equal(j.rc, CP_RDZV_ERROR);
    assert_true(j.seconds >= 0.35 && j.seconds < 3.0);
    assert_null(strchr(j.err, '\n'));
    assert_non_null(strstr(j.err, "rank 2: COMMPLAN_ID_FILE="));
    assert_non_null(strstr(j.err, "job slurm:77.-, plan fp1234 within 0.4 s (no file there yet)"));
    assert_non_null(strstr(j.err, "start rank 0 of this launch"));

    /* Only a stale file of another job: never read, and the message says so. */
    char jpath[4200];
    snprintf(jpath, sizeof jpath, "%s", j.env.id_file);
    write_text(jpath, STALE);
    rank_main(&j);
    assert_int_equal(j.rc, CP_RDZV_ERROR);
    assert_non_null(strstr(j.err, "the file there is job gen:old-job, plan fp1234: stale"));

    /* Rank 0 cannot write into a missing directory: it says where and why. */
    const char *env0[] = { "SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "SLURM_JOB_ID=77",
                           "COMMPLAN_ID_FILE=/nonexistent-commplan-dir/id", NULL };
    assert_int_equal(launch(env0, &j.env, err), 0);
    fill_id(j.bytes, 1);
    rank_main(&j);
    assert_int_equal(j.rc, CP_RDZV_ERROR);
    assert_non_null(strstr(j.err, "rank 0: COMMPLAN_ID_FILE=/nonexistent-commplan-dir/id."));
    assert_non_null(strstr(j.err, ": open of"));
    assert_non_null(strstr(j.err, "No such file or directory"));

    assert_int_equal(unlink(jpath), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* The binary run twice in one job with the same environment (a script
 * running a check and then a timing run, or two runs in one srun step):
 * the second run's ranks 1..3 start before its rank 0 and must wait for the
 * second run's id, never take the first run's from the file it left. */
static void test_id_file_second_run_of_a_job(void **state)
{
    (void)state;
    char dir[] = "/tmp/commplan-rdzv-XXXXXX", path[256], file_var[300], jpath[4200], err[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/nccl.id", dir);
    snprintf(file_var, sizeof file_var, "COMMPLAN_ID_FILE=%s", path);
    const char *env[] = { "WORLD_SIZE=4", "LOCAL_RANK=0", file_var, "SLURM_JOB_ID=31", "SLURM_STEP_ID=0", NULL };
    job_path(env, jpath, sizeof jpath);
    rank_job jobs[RANKS];
    struct stat st;

    /* As gpu.c: rank 0 releases the file after NCCL's init (here: once
     * every rank has returned); the next run then finds nothing stale. */
    run_ranks_seed(jobs, env, "fp1234", 5);
    assert_int_equal(cp_rendezvous_release(&jobs[1].env, "fp1234", jobs[0].bytes, ID_BYTES, err, sizeof err), 0);
    assert_int_equal(lstat(jpath, &st), 0); /* not rank 0: nothing removed */
    assert_int_equal(cp_rendezvous_release(&jobs[0].env, "fp1234", jobs[0].bytes, ID_BYTES, err, sizeof err), 0);
    assert_int_equal(lstat(jpath, &st), -1);
    assert_int_equal(errno, ENOENT);
    assert_int_equal(cp_rendezvous_release(&jobs[0].env, "fp1234", jobs[0].bytes, ID_BYTES, err, sizeof err), 0);
    run_ranks_seed(jobs, env, "fp1234", 9);
    /* A release naming another run's id leaves this run's file alone. */
    unsigned char old[ID_BYTES];
    fill_id(old, 5);
    assert_int_equal(cp_rendezvous_release(&jobs[0].env, "fp1234", old, ID_BYTES, err, sizeof err), 0);
    assert_int_equal(lstat(jpath, &st), 0);
    assert_int_equal(cp_rendezvous_release(&jobs[0].env, "fp1234", jobs[0].bytes, ID_BYTES, err, sizeof err), 0);

    /* As --rendezvous-only (no NCCL init): every rank confirms; two runs in
     * a row, each rank's second run right after its first. */
    confirm_runs = 1;
    run_ranks_seed(jobs, env, "fp1234", 11);
    run_ranks_seed(jobs, env, "fp1234", 12);
    confirm_runs = 0;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "test \"$(ls -A %s | wc -l)\" = 0", dir); /* no id file, no acknowledgement left */
    assert_int_equal(system(cmd), 0);

    /* A rank that never confirms: rank 0 names it, in time. */
    rank_job j0;
    memset(&j0, 0, sizeof j0);
    const char *env0[] = { "RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=0", file_var, "SLURM_JOB_ID=31", "SLURM_STEP_ID=0",
                           NULL };
    assert_int_equal(launch(env0, &j0.env, err), 0);
    j0.key = "fp1234";
    j0.timeout_s = 0.4;
    j0.confirm = 1;
    fill_id(j0.bytes, 13);
    rank_main(&j0);
    assert_int_equal(j0.rc, CP_RDZV_ERROR);
    assert_null(strchr(j0.err, '\n'));
    assert_non_null(strstr(j0.err, "rank 0: COMMPLAN_ID_FILE="));
    assert_non_null(strstr(j0.err, "rank 1 did not acknowledge the NCCL id within 0.4 s"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* COMMPLAN_ID_FILE that is not a regular file: a FIFO (a plain open()
 * waits for a writer forever), a device that never ends, a directory. Every
 * rank says what the path is, at once, in one line; rank 0 leaves it alone.
 * launch.c refuses them up front; these ranks get the path past it, as if
 * it were swapped after launch. */
static void test_id_file_not_regular(void **state)
{
    (void)state;
    char dir[] = "/tmp/commplan-rdzv-XXXXXX", fifo[256], err[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/nccl.id", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *paths[] = { fifo, "/dev/zero", dir };
    const char *kinds[] = { "is a FIFO, not a regular file", "is a character device, not a regular file",
                            "is a directory, not a regular file" };
    for (int i = 0; i < 3; i++)
        for (int rank = 1; rank >= 0; rank--) {
            if (i == 1 && rank == 0) continue; /* rank 0 never gets to rename anything over a device */
            const char *env[] = { rank ? "RANK=1" : "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0",
                                  "COMMPLAN_ID_FILE=/nonexistent-commplan-dir/id", "COMMPLAN_ID_GENERATION=g1",
                                  NULL };
            rank_job j;
            memset(&j, 0, sizeof j);
            assert_int_equal(launch(env, &j.env, err), 0);
            snprintf(j.env.id_file, sizeof j.env.id_file, "%s", paths[i]);
            j.key = "fp1234";
            j.timeout_s = 10;
            fill_id(j.bytes, 2);
            rank_main(&j);
            assert_int_equal(j.rc, CP_RDZV_ERROR);
            if (j.seconds > 2.0) fail_msg("rank %d took %.1f s on %s", rank, j.seconds, paths[i]);
            assert_null(strchr(j.err, '\n'));
            if (!strstr(j.err, kinds[i]) || !strstr(j.err, rank ? "rank 1: COMMPLAN_ID_FILE" : "rank 0: COMMPLAN_ID_FILE"))
                fail_msg("%s: %s", paths[i], j.err);
        }
    struct stat st;
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode)); /* rank 0 did not rename over it */

    /* launch.c names them before any rank waits. */
    for (int i = 0; i < 3; i++) {
        char var[300];
        snprintf(var, sizeof var, "COMMPLAN_ID_FILE=%s", paths[i]);
        const char *env[] = { "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", var, "COMMPLAN_ID_GENERATION=g1", NULL };
        cp_launch_env L;
        assert_int_equal(launch(env, &L, err), -1);
        assert_null(strchr(err, '\n'));
        if (!strstr(err, kinds[i]) || !strstr(err, "$COMMPLAN_ID_FILE=")) fail_msg("%s: %s", paths[i], err);
    }
    assert_int_equal(unlink(fifo), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* Rank 0 writes through no symlink: one planted at COMMPLAN_ID_FILE is
 * replaced, ones planted at temporary names (the old name <file>.tmp<pid>
 * and the new .<name>.<pid>.0.tmp) are skipped; their target stays as it was. */
static void test_id_file_symlinks_not_followed(void **state)
{
    (void)state;
    char dir[] = "/tmp/commplan-rdzv-XXXXXX", given[256], victim[256], link[4300], file_var[300], err[1024];
    char path[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(given, sizeof given, "%s/nccl.id", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(file_var, sizeof file_var, "COMMPLAN_ID_FILE=%s", given);
    const char *env[] = { "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", file_var, "COMMPLAN_ID_GENERATION=g2", NULL };
    job_path(env + 1, path, sizeof path); /* the job's file: symlinks planted at it and its temporaries */
    write_text(victim, "precious\n");
    assert_int_equal(symlink("victim", path), 0);
    snprintf(link, sizeof link, "%s.tmp%ld", path, (long)getpid());
    assert_int_equal(symlink("victim", link), 0);
    snprintf(link, sizeof link, "%s/.%s.%ld.0.tmp", dir, strrchr(path, '/') + 1, (long)getpid());
    assert_int_equal(symlink("victim", link), 0);
    rank_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(launch(env, &j.env, err), 0);
    j.key = "fp1234";
    j.timeout_s = 5;
    fill_id(j.bytes, 3);
    rank_main(&j);
    if (j.rc != CP_RDZV_SHARED) fail_msg("%s", j.err);
    assert_string_equal(read_text(victim), "precious\n");
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_non_null(strstr(read_text(path), "job gen:g2\nkey fp1234\n"));
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- torchrun's store, played by tests/fake_tcpstore.py ---- */

typedef struct {
    pid_t pid;
    int port;
    char dir[64], log[128];
} fake_store;

static int have_python(void) { return system("command -v python3 >/dev/null 2>&1") == 0; }

static void store_start(fake_store *s, const char *mode)
{
    if (!have_python()) skip(); /* printed as a visible SKIP by cmocka */
    assert_int_equal(access(FAKE_STORE, R_OK), 0); /* run from the repository root */
    snprintf(s->dir, sizeof s->dir, "/tmp/commplan-store-XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    char port_file[128];
    snprintf(port_file, sizeof port_file, "%s/port", s->dir);
    snprintf(s->log, sizeof s->log, "%s/log", s->dir);
    char *argv[] = { "python3", FAKE_STORE, "--port-file", port_file, "--mode", (char *)mode, "--log", s->log,
                     "--max-seconds", "60", NULL };
    assert_int_equal(posix_spawnp(&s->pid, "python3", NULL, NULL, argv, environ), 0);
    s->port = 0;
    for (int i = 0; i < 1000 && s->port == 0; i++) {
        FILE *f = fopen(port_file, "r");
        if (f) {
            assert_int_equal(fscanf(f, "%d", &s->port), 1);
            assert_int_equal(fclose(f), 0);
        } else {
            struct timespec t = { 0, 10 * 1000 * 1000 };
            nanosleep(&t, NULL);
        }
    }
    assert_true(s->port > 0);
}

static void store_stop(fake_store *s)
{
    int status;
    assert_int_equal(kill(s->pid, SIGTERM), 0);
    assert_int_equal(waitpid(s->pid, &status, 0), s->pid);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s->dir);
    assert_int_equal(system(cmd), 0);
}

static void store_env(const fake_store *s, char *port_var, size_t n, const char **env)
{
    snprintf(port_var, n, "MASTER_PORT=%d", s->port);
    const char *base[] = { "WORLD_SIZE=4", "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1", port_var,
                           "TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RUN_ID=run7",
                           "TORCHELASTIC_RESTART_COUNT=1", NULL };
    memcpy(env, base, sizeof base);
}

static void test_tcpstore_four_ranks(void **state)
{
    (void)state;
    fake_store s;
    store_start(&s, "serve");
    char port_var[32];
    const char *env[8];
    store_env(&s, port_var, sizeof port_var, env);
    rank_job jobs[RANKS];
    run_ranks(jobs, env, "fp1234");
    /* The queries PyTorch's client would send, key prefixed with "/". */
    const char *log = read_text(s.log);
    assert_non_null(strstr(log, "ADD /commplan/run7/1/launches 1\n"));
    assert_non_null(strstr(log, "SET /commplan/run7/1/launch0/hello/3 8\n")); /* "fp1234 ?": no plan name */
    assert_non_null(strstr(log, "WAIT /commplan/run7/1/launch0/hello/1 /commplan/run7/1/launch0/hello/2 "
                                "/commplan/run7/1/launch0/hello/3\n"));
    assert_non_null(strstr(log, "SET /commplan/run7/1/launch0/nccl_id 128\n"));
    assert_non_null(strstr(log, "WAIT /commplan/run7/1/launch0/verdict\n"));
    assert_non_null(strstr(log, "GET /commplan/run7/1/launch0/verdict 2\n"));
    assert_non_null(strstr(log, "GET /commplan/run7/1/launch0/nccl_id 128\n"));
    assert_null(strstr(log, "not validated"));
    int validated = 0;
    for (const char *p = log; (p = strstr(p, "VALIDATE ok")) != NULL; p++) validated++;
    assert_int_equal(validated, RANKS);
    store_stop(&s);
}

/* The binary run twice in one torchrun launch (a script calling it twice):
 * the second run's ranks count a launch of their own and get the second
 * run's id, never the first's (whose keys are still in the store). */
static void test_tcpstore_second_run_of_a_launch(void **state)
{
    (void)state;
    fake_store s;
    store_start(&s, "serve");
    char port_var[32];
    const char *env[8];
    store_env(&s, port_var, sizeof port_var, env);
    rank_job jobs[RANKS];
    run_ranks_seed(jobs, env, "fp1234", 5);
    run_ranks_seed(jobs, env, "fp1234", 9);
    const char *log = read_text(s.log);
    assert_non_null(strstr(log, "SET /commplan/run7/1/launch1/nccl_id 128\n"));
    assert_non_null(strstr(log, "GET /commplan/run7/1/launch1/nccl_id 128\n"));
    store_stop(&s);
}

/* One rank built from another plan: every rank is refused with the same
 * line naming that rank, both plans and both fingerprints, before any id is
 * handed out. */
static void test_tcpstore_other_plan_refused_everywhere(void **state)
{
    (void)state;
    fake_store s;
    store_start(&s, "serve");
    char port_var[32];
    const char *env[8];
    store_env(&s, port_var, sizeof port_var, env);
    rank_job jobs[RANKS];
    const char *keys[RANKS] = { NULL, NULL, "ab12cd34ef56ab78", NULL };
    const char *plans[RANKS] = { "fsdp4", "fsdp4", "hsdp2x2", "fsdp4" };
    start_ranks(jobs, env, "0123456789abcdef", keys, plans, 5);
    for (int r = 0; r < RANKS; r++) {
        if (jobs[r].rc != CP_RDZV_ERROR) fail_msg("rank %d was not refused", r);
        assert_null(strchr(jobs[r].err, '\n'));
        char want[96];
        snprintf(want, sizeof want, "rank %d: rank 2 runs plan hsdp2x2 (fingerprint ab12cd34ef56ab78)", r);
        if (!strstr(jobs[r].err, want) || !strstr(jobs[r].err, "rank 0 plan fsdp4 (fingerprint 0123456789abcdef)"))
            fail_msg("rank %d: %s", r, jobs[r].err);
        assert_non_null(strstr(jobs[r].err, "deploy one build of one plan to every rank"));
    }
    assert_null(strstr(read_text(s.log), "nccl_id"));
    store_stop(&s);
}

/* A run in which only rank 0 reached the store (the others failed before
 * it): the launch counter no longer pairs the ranks of the next run (rank 0
 * counts run 1, the others run 0), which no store protocol can tell from
 * slow ranks. Every rank times out naming the run it counted. */
static void test_tcpstore_runs_out_of_step(void **state)
{
    (void)state;
    fake_store s;
    store_start(&s, "serve");
    char port_var[32], err[1024];
    const char *env[9];
    store_env(&s, port_var, sizeof port_var, env + 1);
    env[0] = "RANK=0";
    rank_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(launch(env, &j.env, err), 0);
    j.key = "fp1234";
    j.timeout_s = 0.3;
    fill_id(j.bytes, 1);
    rank_main(&j);
    assert_int_equal(j.rc, CP_RDZV_ERROR);
    rank_job jobs[RANKS];
    pthread_t th[RANKS];
    for (int r = 0; r < RANKS; r++) {
        char rank_var[32];
        snprintf(rank_var, sizeof rank_var, "RANK=%d", r);
        env[0] = rank_var;
        memset(&jobs[r], 0, sizeof jobs[r]);
        assert_int_equal(launch(env, &jobs[r].env, err), 0);
        jobs[r].key = "fp1234";
        jobs[r].timeout_s = 0.8;
        fill_id(jobs[r].bytes, 2);
    }
    /* Ranks 1..3 count first (their three ADDs in the store's log after
     * rank 0's earlier one), then rank 0. */
    for (int r = 1; r < RANKS; r++) assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    int adds = 0;
    for (int tries = 0; tries < 2000 && adds < RANKS; tries++) {
        adds = 0;
        for (const char *q = read_text(s.log); (q = strstr(q, "ADD /commplan/")) != NULL; q++) adds++;
        struct timespec t = { 0, 5 * 1000 * 1000 };
        if (adds < RANKS) nanosleep(&t, NULL);
    }
    assert_int_equal(adds, RANKS);
    assert_int_equal(pthread_create(&th[0], NULL, rank_main, &jobs[0]), 0);
    for (int r = 0; r < RANKS; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    for (int r = 0; r < RANKS; r++) {
        char want[64];
        snprintf(want, sizeof want, "this rank counted run %d of the binary", r == 0 ? 1 : 0);
        if (jobs[r].rc != CP_RDZV_ERROR || !strstr(jobs[r].err, want) || !strstr(jobs[r].err, "restart the launch") ||
            strchr(jobs[r].err, '\n'))
            fail_msg("rank %d: %s", r, jobs[r].err);
    }
    store_stop(&s);
}

/* rank 2 of a run whose rank 0 never comes: the WAIT times out. */
static void test_tcpstore_wait_timeout(void **state)
{
    (void)state;
    fake_store s;
    store_start(&s, "serve");
    char port_var[32], err[1024], rank_var[] = "RANK=2";
    const char *env[9];
    store_env(&s, port_var, sizeof port_var, env + 1);
    env[0] = rank_var;
    rank_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(launch(env, &j.env, err), 0);
    j.key = "fp1234";
    j.timeout_s = 0.5;
    rank_main(&j);
    assert_int_equal(j.rc, CP_RDZV_ERROR);
    assert_true(j.seconds >= 0.45 && j.seconds < 3.0);
    assert_null(strchr(j.err, '\n'));
    assert_non_null(strstr(j.err, "rank 2: torchrun's store 127.0.0.1:"));
    assert_non_null(strstr(j.err, "WAIT for rank 0's verdict did not finish within 0.5 s"));
    store_stop(&s);
}

/* A server that hangs up, or never answers, or nothing listening: the
 * one-line error within the timeout, not a hang. */
static void hostile_store(const char *mode, int rank, double timeout_s, double max_s, const char *expect)
{
    fake_store s = { 0 };
    char port_var[32], err[1024], rank_var[] = "RANK=1";
    rank_var[5] = (char)('0' + rank);
    const char *env[9];
    if (mode) store_start(&s, mode);
    else {
        /* A port nobody listens on: bind one, note it, close it. */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t al = sizeof a;
        assert_true(fd >= 0);
        assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
        assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
        s.port = ntohs(a.sin_port);
        assert_int_equal(close(fd), 0);
    }
    store_env(&s, port_var, sizeof port_var, env + 1);
    env[0] = rank_var;
    rank_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(launch(env, &j.env, err), 0);
    j.key = "fp1234";
    j.timeout_s = timeout_s;
    if (rank == 0) fill_id(j.bytes, 4);
    rank_main(&j);
    assert_int_equal(j.rc, CP_RDZV_ERROR);
    if (j.seconds > max_s) fail_msg("%s: %.2f s, more than %.1f s: %s", mode ? mode : "nobody", j.seconds, max_s, j.err);
    assert_null(strchr(j.err, '\n'));
    char who[64];
    snprintf(who, sizeof who, "rank %d: torchrun's store 127.0.0.1:", rank);
    assert_non_null(strstr(j.err, who));
    assert_non_null(strstr(j.err, "TORCHELASTIC_USE_AGENT_STORE=True"));
    if (!strstr(j.err, expect)) fail_msg("expected '%s' in: %s", expect, j.err);
    assert_non_null(strstr(j.err, "COMMPLAN_ID_FILE=/shared/path"));
    if (mode) store_stop(&s);
}

static void broken_store(const char *mode, const char *expect) { hostile_store(mode, 1, 0.8, 3.0, expect); }

static void test_tcpstore_hangs_up(void **state)
{
    (void)state;
    broken_store("close", "the store closed the connection instead of answering PING");
}

static void test_tcpstore_never_answers(void **state)
{
    (void)state;
    broken_store("silent", "no answer to PING");
}

static void test_tcpstore_nobody_listens(void **state)
{
    (void)state;
    broken_store(NULL, "connect failed: Connection refused");
}

/* A server that answers with garbage, truncated or huge replies, or stalls
 * mid-reply (tests/fake_tcpstore.py's hostile modes): one line, within the
 * bound; what can never become a store's answer fails at once rather than at
 * the timeout. Under ASan: no read past a buffer, no allocation of a length
 * the server chose. */
static void test_tcpstore_garbage(void **state)
{
    (void)state;
    hostile_store("garbage", 1, 5.0, 2.0, "not a PyTorch TCPStore");
    hostile_store("garbage", 0, 5.0, 2.0, "not a PyTorch TCPStore");
}

static void test_tcpstore_truncated(void **state)
{
    (void)state;
    /* Half a PING echo, then a close: an agent restarting looks the same, so retried until the bound. */
    hostile_store("truncated-ping", 1, 0.8, 3.0, "the store closed the connection instead of answering PING");
    hostile_store("truncated-get", 1, 5.0, 2.0, "the store closed the connection instead of answering GET");
    hostile_store("stall-get", 1, 0.8, 3.0, "no answer to GET");
    hostile_store("bad-wait", 1, 5.0, 2.0, "WAIT answered 127 instead of STOP_WAITING (0)");
    hostile_store("bad-set-ping", 0, 5.0, 2.0, "PING after SET answered");
}

static void test_tcpstore_huge_length(void **state)
{
    (void)state;
    hostile_store("huge-get", 1, 5.0, 2.0, "holds 18446744073709551615 bytes, expected fewer than 1024");
}

/* A store that answers every query with a random mix of right and wrong
 * replies, cut short, or closes, or goes silent (fake_tcpstore.py --mode
 * random): rank 0 and rank 1 each finish within the bound, with the id or
 * with one line, 12 times. */
static void test_tcpstore_random_replies(void **state)
{
    (void)state;
    fake_store s;
    store_start(&s, "random");
    char port_var[32], err[1024];
    const char *env[9];
    store_env(&s, port_var, sizeof port_var, env + 1);
    int shared = 0, failed = 0;
    for (int round = 0; round < 12; round++) {
        env[0] = round % 2 ? "RANK=1" : "RANK=0";
        rank_job j;
        memset(&j, 0, sizeof j);
        assert_int_equal(launch(env, &j.env, err), 0);
        j.key = "fp1234";
        j.timeout_s = 0.3;
        fill_id(j.bytes, 6);
        rank_main(&j);
        if (j.seconds > 2.0) fail_msg("round %d: %.2f s: %s", round, j.seconds, j.err);
        if (j.rc == CP_RDZV_SHARED) {
            shared++;
            continue;
        }
        failed++;
        assert_int_equal(j.rc, CP_RDZV_ERROR);
        assert_null(strchr(j.err, '\n'));
        if (!strstr(j.err, round % 2 ? "rank 1: torchrun's store 127.0.0.1:" : "rank 0: torchrun's store 127.0.0.1:"))
            fail_msg("round %d: %s", round, j.err);
    }
    assert_int_equal(shared + failed, 12);
    store_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_channel_selection),   cmocka_unit_test(test_comm_id_action),   cmocka_unit_test(test_id_file_four_ranks),
        cmocka_unit_test(test_id_file_timeout),     cmocka_unit_test(test_tcpstore_four_ranks),
        cmocka_unit_test(test_tcpstore_wait_timeout), cmocka_unit_test(test_tcpstore_hangs_up),
        cmocka_unit_test(test_tcpstore_never_answers), cmocka_unit_test(test_tcpstore_nobody_listens),
        cmocka_unit_test(test_id_file_not_regular),  cmocka_unit_test(test_id_file_symlinks_not_followed),
        cmocka_unit_test(test_tcpstore_garbage),     cmocka_unit_test(test_tcpstore_truncated),
        cmocka_unit_test(test_tcpstore_huge_length),  cmocka_unit_test(test_tcpstore_random_replies),
        cmocka_unit_test(test_tcpstore_second_run_of_a_launch), cmocka_unit_test(test_id_file_second_run_of_a_job),
        cmocka_unit_test(test_tcpstore_other_plan_refused_everywhere), cmocka_unit_test(test_tcpstore_runs_out_of_step),
    };
    /* A wait that is not bounded (a FIFO's open) fails the run instead of hanging it. */
    alarm(120);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
