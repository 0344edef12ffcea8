/* The emulated CUDA runtime's own tests: each case does on purpose what a
 * runtime bug would do (or its correct counterpart) and checks what the
 * emulator reports. One process, no NCCL, but for the point-to-point case
 * first: two processes (a fork) exchanging messages over the emulated
 * ncclSend / ncclRecv. Prints one line per case and
 * "emu selftest: N passed, N failed"; exits 1 if any failed. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int passed, failed;

typedef struct {
    const void *read;
    void *write;
    size_t bytes;
} touch;

static void touch_body(const void *p)
{
    const touch *t = p;
    if (t->read) cudaEmuAccess(t->read, t->bytes, 0);
    if (t->write) cudaEmuAccess(t->write, t->bytes, 1);
}

static void kernel(cudaStream_t s, const void *read, void *write, size_t bytes)
{
    touch t = { read, write, bytes };
    if (cudaEmuLaunchKernel(s, "selftest", touch_body, &t, sizeof t, offsetof(touch, write), 1) != cudaSuccess) {
        printf("  FAIL  kernel launch refused\n");
        failed++;
    }
}

/* A case passes when the findings it made are as many as it expects (0 or more). */
static void expect(const char *what, int want_findings)
{
    cudaDeviceSynchronize();
    long n = cudaEmuFindings();
    int ok = want_findings ? n > 0 : n == 0;
    printf("  %s  %s (%ld findings)\n", ok ? "ok  " : "FAIL", what, n);
    if (ok) passed++; else failed++;
    cudaEmuClearFindings();
}

/* Rank `rank` of two: a group whose receive comes before its send on both
 * ranks (NCCL posts a group together: no deadlock), then a lone send from
 * rank 0 that rank 1 receives, both checked element for element; then a
 * receive whose count differs from its send's, which rank 1 must report.
 * 0 when this rank saw what it should. */
static int p2p_rank(int rank)
{
    enum { N = 64 };
    ncclUniqueId id;
    ncclComm_t comm;
    cudaStream_t s;
    float host[N], got[N];
    float *send, *recv;
    int peer = 1 - rank, bad = 0;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMalloc((void **)&send, sizeof host) ||
        cudaMalloc((void **)&recv, sizeof host))
        return 1;
    for (int i = 0; i < N; i++) host[i] = (float)(1000 * rank + i);
    cudaMemcpyAsync(send, host, sizeof host, cudaMemcpyHostToDevice, s);
    ncclGroupStart();
    ncclRecv(recv, N, ncclFloat32, peer, comm, s);
    ncclSend(send, N, ncclFloat32, peer, comm, s);
    if (ncclGroupEnd() != ncclSuccess) bad = 1;
    cudaMemcpyAsync(got, recv, sizeof got, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    for (int i = 0; i < N; i++) bad |= got[i] != (float)(1000 * peer + i);
    /* a lone send and its receive, then a pair whose counts differ */
    if (rank == 0) {
        ncclSend(recv, N, ncclFloat32, peer, comm, s); /* rank 1's own values back */
        ncclSend(send, 8, ncclFloat32, peer, comm, s);
    } else {
        ncclRecv(send, N, ncclFloat32, peer, comm, s);
        cudaMemcpyAsync(got, send, sizeof got, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        for (int i = 0; i < N; i++) bad |= got[i] != (float)(1000 * rank + i);
        ncclRecv(recv, 16, ncclFloat32, peer, comm, s);
    }
    cudaStreamSynchronize(s);
    long findings = cudaEmuFindings();
    bad |= findings != (rank == 1); /* the count mismatch, reported where it is received */
    cudaEmuClearFindings();
    return bad;
}

static void p2p_case(void)
{
    char id[64];
    snprintf(id, sizeof id, "emu-selftest-p2p-%ld", (long)getpid());
    setenv("NCCL_COMM_ID", id, 1); /* both processes derive the same unique id */
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        setenv("RANK", "1", 1);
        exit(p2p_rank(1));
    }
    int mine = child > 0 ? p2p_rank(0) : 1, status = 0;
    if (child > 0) waitpid(child, &status, 0);
    int ok = child > 0 && mine == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    unsetenv("NCCL_COMM_ID");
    printf("  %s  ncclSend / ncclRecv between two processes: a group (receive before send on both ranks), a lone "
           "message, a count mismatch reported by its receiver\n", ok ? "ok  " : "FAIL");
    if (ok) passed++; else failed++;
}

static void host_fn_calls_cuda(void *arg)
{
    (void)arg;
    cudaDeviceSynchronize(); /* CUDA forbids this inside a host function */
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    p2p_case(); /* first: the fork happens before this process starts any emulator thread */
    ncclGroupEnd();
    expect("ncclGroupEnd without ncclGroupStart: refused", 1);
    cudaStream_t a, b, blocking;
    cudaEvent_t e, other;
    char *buf, *small;
    static char host[4096], pinned_src[64];
    if (cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) || cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) ||
        cudaStreamCreate(&blocking) || cudaEventCreateWithFlags(&e, cudaEventDisableTiming) ||
        cudaEventCreateWithFlags(&other, cudaEventDisableTiming) || cudaMalloc((void **)&buf, 4096) ||
        cudaMalloc((void **)&small, 64)) {
        printf("set-up failed\n");
        return 1;
    }
    (void)pinned_src;
    cudaDeviceSynchronize();
    cudaEmuClearFindings();

    kernel(a, NULL, buf, 256);
    kernel(b, buf, NULL, 256);
    expect("two streams, no event: a read after another stream's write is a race", 1);

    kernel(a, NULL, buf, 256);
    cudaEventRecord(e, a);
    cudaStreamWaitEvent(b, e, 0);
    kernel(b, buf, NULL, 256);
    expect("the same with an event record and wait: ordered", 0);

    kernel(a, NULL, buf, 256);
    cudaEventRecord(e, a);
    cudaEventRecord(e, b); /* the slot reused before the wait: the wait now means b's record */
    cudaStreamWaitEvent(b, e, 0);
    kernel(b, buf, NULL, 256);
    expect("an event recorded again before its wait: the wait follows the later record only", 1);

    kernel(a, NULL, buf, 256);
    cudaStreamSynchronize(a);
    kernel(b, buf, NULL, 256);
    expect("a host synchronisation between the two: ordered", 0);

    cudaMemset(buf, 0, 256);
    kernel(a, buf, NULL, 256);
    expect("cudaMemset (legacy stream) then a non-blocking stream's read: a race", 1);

    cudaMemset(buf, 0, 256);
    kernel(blocking, buf, NULL, 256);
    expect("cudaMemset then a blocking stream's read: the legacy stream orders it", 0);

    cudaMemcpy(buf, host, 256, cudaMemcpyHostToDevice); /* pageable: returns before the bytes land */
    kernel(a, buf, NULL, 256);
    expect("pageable cudaMemcpy to the device then a non-blocking stream's read: a race", 1);

    kernel(a, NULL, small + 32, 64);
    expect("a kernel writing past its allocation: illegal (and sticky)", 1);

    cudaLaunchHostFunc(a, host_fn_calls_cuda, NULL);
    expect("a host function calling CUDA: refused", 1);

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    void *p = NULL;
    cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal);
    kernel(a, NULL, buf, 256);
    cudaError_t m = cudaMalloc(&p, 64);
    cudaError_t end = cudaStreamEndCapture(a, &graph);
    printf("        (cudaMalloc: %s; cudaStreamEndCapture: %s)\n", cudaGetErrorString(m), cudaGetErrorString(end));
    expect("cudaMalloc inside a capture: refused, the capture invalidated",
           m == cudaErrorStreamCaptureUnsupported && end == cudaErrorStreamCaptureInvalidated);

    cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(e, a);
    cudaStreamWaitEvent(b, e, 0); /* b joins the capture ... */
    kernel(b, NULL, buf, 256);    /* ... and is never joined back */
    end = cudaStreamEndCapture(a, &graph);
    printf("        (cudaStreamEndCapture: %s)\n", cudaGetErrorString(end));
    expect("a stream forked into a capture and not joined back: refused", end == cudaErrorStreamCaptureUnjoined);

    kernel(b, NULL, buf, 256);
    cudaEventRecord(other, b);
    cudaStreamSynchronize(b);
    cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal);
    cudaStreamWaitEvent(a, other, 0);
    end = cudaStreamEndCapture(a, &graph);
    expect("a wait inside a capture on an event recorded before it: refused (the graph keeps no such edge)", 1);

    /* A graph: a forks b, each writes its half, a joins b and reads both. */
    cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(e, a);
    cudaStreamWaitEvent(b, e, 0);
    kernel(a, NULL, buf, 128);
    kernel(b, NULL, buf + 128, 128);
    cudaEventRecord(other, b);
    cudaStreamWaitEvent(a, other, 0);
    kernel(a, buf, NULL, 256);
    end = cudaStreamEndCapture(a, &graph);
    int launched = end == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess &&
                   cudaGraphLaunch(exec, a) == cudaSuccess && cudaGraphLaunch(exec, a) == cudaSuccess;
    cudaStreamSynchronize(a);
    expect("a captured fork and join, replayed twice: ordered by the graph's edges", !launched);

    cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(e, a);
    cudaStreamWaitEvent(b, e, 0);
    kernel(a, NULL, buf, 256);
    kernel(b, NULL, buf, 256); /* both write the same bytes, unordered */
    cudaEventRecord(other, b);
    cudaStreamWaitEvent(a, other, 0);
    end = cudaStreamEndCapture(a, &graph);
    launched = end == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess &&
               cudaGraphLaunch(exec, a) == cudaSuccess;
    cudaStreamSynchronize(a);
    expect("two lanes of a graph writing the same bytes without an edge: a race", launched);

    printf("emu selftest: %d passed, %d failed\n", passed, failed);
    fflush(stdout);
    cudaEmuClearFindings(); /* the cases made their findings on purpose */
    return failed ? 1 : 0;
}
