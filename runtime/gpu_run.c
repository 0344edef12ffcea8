/* --check and timing on the GPU for the local rank. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_run.h"
#include "harness.h"
#include "safeio.h"

/* --check's compute placeholders on the GPU, the same for eager steps and
 * a captured graph: the unsharded parameters are copied into pinned host
 * memory on the op's stream, a host function node checks them and writes
 * the pattern gradients (accumulated on later micro-steps), and those are
 * copied back, all in stream order: no synchronize, so the whole step can
 * be captured and replayed with every check still running. */
typedef struct {
    cp_harness *h;
    const cp_op *op;
    void *pinned; /* scratch as large as the largest unit buffer */
} compute_call;

typedef struct {
    cp_harness harness; /* first: the harness's collective hook gets this struct as its cp_harness */
    cudaStream_t stream;
    void *pinned;
    compute_call *calls; /* one per op: host functions read their op from here */
} check_state;

static void CUDART_CB check_on_host(void *arg)
{
    compute_call *c = arg;
    cp_checker *chk = &c->h->check;
    int u = c->op->unit;
    const cp_plan *p = chk->plan;
    /* Unsharded params first (copied at the front of the scratch), then grads. */
    size_t unsharded = (size_t)cp_arena_buffer_bytes(p, u, CP_BUF_UNSHARDED);
    char *grads = (char *)c->pinned + ((unsharded + 255) / 256) * 256;
    if (cp_compute_reads_params(&p->units[u], c->op->kind))
        cp_checker_check_unsharded(chk, u, c->pinned,
                                   c->op->kind == CP_OP_FORWARD ? "unsharded param in forward" : "unsharded param in backward");
    if (c->op->kind == CP_OP_BACKWARD) /* (a part's backward: its parameters' grads only) */
        cp_checker_add_grads_part(chk, u, c->op->part_first, c->op->part_count, c->op->micro_step, grads);
}

/* A placeholder's CUDA call failed: say which (the executor adds rank, op and unit). */
static int cuda_failed(const cp_executor *ex, const char *what, cudaError_t e)
{
    fprintf(stderr, "commplan: rank %d: --check: %s failed: %s\n", ex->rank, what, cudaGetErrorString(e));
    return -1;
}

static int gpu_check_compute(void *user, cp_executor *ex, const cp_op *op)
{
    check_state *cs = user;
    compute_call *c = &cs->calls[op - ex->plan->ops];
    const cp_plan *p = ex->plan;
    int u = op->unit;
    cudaStream_t s = cs->stream;
    size_t unsharded = (size_t)cp_arena_buffer_bytes(p, u, CP_BUF_UNSHARDED);
    size_t grads_bytes = (size_t)cp_arena_buffer_bytes(p, u, CP_BUF_GRADS);
    char *grads = (char *)c->pinned + ((unsharded + 255) / 256) * 256;
    cudaError_t e;
    if (op->stream != CP_STREAM_COMPUTE) return cuda_failed(ex, "a compute op off the compute stream", cudaErrorInvalidValue);
    if ((e = cudaMemcpyAsync(c->pinned, ex->buf[CP_BUF_UNSHARDED][u], unsharded, cudaMemcpyDeviceToHost, s)))
        return cuda_failed(ex, "copying the unsharded params to pinned memory", e);
    /* (a part's backward leaves the other parameters' grads as they are: read them too) */
    if (op->kind == CP_OP_BACKWARD && (op->part_count > 0 || !cp_checker_grads_fresh(&c->h->check, u, op->micro_step)) &&
        (e = cudaMemcpyAsync(grads, ex->buf[CP_BUF_GRADS][u], grads_bytes, cudaMemcpyDeviceToHost, s)))
        return cuda_failed(ex, "copying the grads to pinned memory", e);
    if ((e = cudaLaunchHostFunc(s, check_on_host, c))) return cuda_failed(ex, "cudaLaunchHostFunc", e);
    if (op->kind == CP_OP_BACKWARD &&
        (e = cudaMemcpyAsync(ex->buf[CP_BUF_GRADS][u], grads, grads_bytes, cudaMemcpyHostToDevice, s)))
        return cuda_failed(ex, "copying the grads back", e);
    return 0;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

/* Activation collectives (TP's, CP's), the same way: a host function writes the
 * pattern into pinned memory, copied into the op's input on the stream;
 * after the op its output is copied back and a host function checks it. */
static void CUDART_CB act_fill_on_host(void *arg)
{
    compute_call *c = arg;
    cp_checker_act_input(&c->h->check, c->op, cp_op_group_key(c->h->ex->plan, c->op, c->h->ex->rank),
                         cp_op_group_size(c->h->ex->plan, c->op),
                         c->pinned);
}

static void CUDART_CB act_check_on_host(void *arg)
{
    compute_call *c = arg;
    cp_checker_act_output(&c->h->check, c->op, cp_op_group_key(c->h->ex->plan, c->op, c->h->ex->rank),
                          cp_op_group_size(c->h->ex->plan, c->op),
                          c->pinned);
}

static int gpu_check_activation(void *user, cp_executor *ex, const cp_op *op, int after)
{
    check_state *cs = user;
    compute_call *c = &cs->calls[op - ex->plan->ops];
    const cp_op_desc *d = &cp_op_descs[op->kind];
    int key, size;
    if (cp_checker_act_group(&cs->harness.check, op, &key, &size)) return 0; /* counted; the op runs unchecked */
    size_t n = (size_t)size, es = cp_dtype_size(op->dtype); /* the op's group */
    cudaError_t e;
    (void)key;
    /* The generator puts them on the compute stream, which the pinned scratch's uses are ordered on. */
    if (op->stream != CP_STREAM_COMPUTE) return cuda_failed(ex, "an activation collective off the compute stream", cudaErrorInvalidValue);
    if (!after) {
        size_t len = (size_t)op->count * (op->kind == CP_OP_TP_REDUCE_SCATTER ? n : 1);
        if ((e = cudaLaunchHostFunc(cs->stream, act_fill_on_host, c))) return cuda_failed(ex, "cudaLaunchHostFunc", e);
        if ((e = cudaMemcpyAsync(cp_executor_op_buffer(ex, op, d->in, d->in_slot), c->pinned, len * es,
                                 cudaMemcpyHostToDevice, cs->stream)))
            return cuda_failed(ex, "copying the activation input", e);
        return 0;
    }
    size_t len = (size_t)op->count * (op->kind == CP_OP_TP_ALL_GATHER ? n : 1);
    if ((e = cudaMemcpyAsync(c->pinned, cp_executor_op_buffer(ex, op, d->out, d->out_slot), len * es,
                             cudaMemcpyDeviceToHost, cs->stream)))
        return cuda_failed(ex, "copying the activation output", e);
    if ((e = cudaLaunchHostFunc(cs->stream, act_check_on_host, c))) return cuda_failed(ex, "cudaLaunchHostFunc", e);
    return 0;
}

/* Pipeline messages, the same way: a host function writes the message
 * (the pattern of this rank, tag, micro-step) into pinned memory, copied
 * into the send's slot on the stream; after a receive its slot is copied
 * back and a host function checks it against the peer's pattern. */
static void CUDART_CB p2p_fill_on_host(void *arg)
{
    compute_call *c = arg;
    cp_checker_p2p_message(&c->h->check, c->op, c->h->ex->rank, c->pinned);
}

static void CUDART_CB p2p_check_on_host(void *arg)
{
    compute_call *c = arg;
    const cp_executor *ex = c->h->ex;
    cp_checker_p2p_check(&c->h->check, c->op, cp_pp_peer_rank(ex->plan, ex->rank, c->op->peer), c->pinned);
}

static int gpu_check_p2p(void *user, cp_executor *ex, const cp_op *op, int after)
{
    check_state *cs = user;
    compute_call *c = &cs->calls[op - ex->plan->ops];
    const cp_op_desc *d = &cp_op_descs[op->kind];
    size_t bytes = (size_t)op->count * cp_dtype_size(op->dtype);
    cudaError_t e;
    /* The pinned scratch's uses are ordered on the compute stream only. */
    if (op->stream != CP_STREAM_COMPUTE) return cuda_failed(ex, "a pipeline message off the compute stream", cudaErrorInvalidValue);
    if (!after) {
        if ((e = cudaLaunchHostFunc(cs->stream, p2p_fill_on_host, c))) return cuda_failed(ex, "cudaLaunchHostFunc", e);
        if ((e = cudaMemcpyAsync(cp_executor_op_buffer(ex, op, d->in, d->in_slot), c->pinned, bytes,
                                 cudaMemcpyHostToDevice, cs->stream)))
            return cuda_failed(ex, "copying the message to send", e);
        return 0;
    }
    if ((e = cudaMemcpyAsync(c->pinned, cp_executor_op_buffer(ex, op, d->out, d->out_slot), bytes,
                             cudaMemcpyDeviceToHost, cs->stream)))
        return cuda_failed(ex, "copying the received message", e);
    if ((e = cudaLaunchHostFunc(cs->stream, p2p_check_on_host, c))) return cuda_failed(ex, "cudaLaunchHostFunc", e);
    return 0;
}

/* Expert parallelism's all-to-alls: the harness's synchronous hook (no
 * graph runs a plan with them), its host copies ordered on the op's stream. */
static int gpu_check_a2a(void *user, cp_executor *ex, const cp_op *op, int after)
{
    check_state *cs = user;
    return cp_harness_on_a2a(&cs->harness, ex, op, after);
}

static int run_check(cp_gpu *g, const cp_plan *p, const cp_gpu_run_options *o, cudaStream_t S)
{
    check_state cs;
    memset(&cs, 0, sizeof cs);
    cp_executor *ex = cp_gpu_executor(g);
    cp_gpu_use_stream(g, S);
    size_t biggest = 0;
    for (int u = 0; u < p->nunits; u++) {
        size_t n = ((size_t)cp_arena_buffer_bytes(p, u, CP_BUF_UNSHARDED) + 255) / 256 * 256 +
                   (size_t)cp_arena_buffer_bytes(p, u, CP_BUF_GRADS);
        if (n > biggest) biggest = n;
        if ((size_t)cp_arena_buffer_bytes(p, u, CP_BUF_ACT) > biggest) biggest = (size_t)cp_arena_buffer_bytes(p, u, CP_BUF_ACT);
        if ((size_t)cp_arena_buffer_bytes(p, u, CP_BUF_PP) > biggest) biggest = (size_t)cp_arena_buffer_bytes(p, u, CP_BUF_PP);
        for (int k = CP_BUF_A2A_COUNTS; k <= CP_BUF_A2A_RECV; k++)
            if ((size_t)cp_arena_buffer_bytes(p, u, (cp_buffer)k) > biggest)
                biggest = (size_t)cp_arena_buffer_bytes(p, u, (cp_buffer)k);
    }
    if (cudaMallocHost(&cs.pinned, biggest ? biggest : 1) != cudaSuccess) {
        fprintf(stderr, "commplan: rank %d: cudaMallocHost of %zu bytes for --check failed\n", cp_gpu_rank(g), biggest);
        return 2;
    }
    cs.calls = calloc((size_t)(p->nops > 0 ? p->nops : 1), sizeof *cs.calls);
    if (!cs.calls || cp_harness_init(&cs.harness, ex, o->pattern) != 0) {
        fprintf(stderr, "commplan: out of host memory for --check\n");
        free(cs.calls);
        cudaFreeHost(cs.pinned);
        return 2;
    }
    cs.stream = S;
    for (int i = 0; i < p->nops; i++) cs.calls[i] = (compute_call){ &cs.harness, &p->ops[i], cs.pinned };
    /* The harness writes shards, reads grads and dumps; the compute
     * placeholders are the stream-ordered ones above. */
    ex->on_compute = gpu_check_compute;
    ex->on_activation = gpu_check_activation;
    ex->on_p2p = gpu_check_p2p;
    ex->on_a2a = gpu_check_a2a;
    ex->user = &cs;
    ex->on_collective = NULL;
    if (o->dump_dir) {
        if (o->graph) {
            fprintf(stderr, "commplan: --dump reads every collective's buffers as it runs: use it without --graph\n");
            goto out_err;
        }
        if (cp_harness_open_dump(&cs.harness, o->dump_dir)) goto out_err;
        ex->on_collective = cp_harness_on_collective;
    }
    int rc = 0;
    /* --graph: step 0 runs eagerly first, checked like any step, so every
     * communicator (and NCCL's lazy connection set-up) is first used outside
     * the capture, as the timing run's warm-up does; the capture then
     * replays step 0 and every later step. */
    if (o->graph) {
        if (cp_harness_begin_step(&cs.harness, 0) || cp_gpu_step(g, S) || cp_gpu_synchronize(g, S, o->timeout_s) ||
            cp_harness_end_step(&cs.harness))
            rc = 2;
    }
    for (int s = 0; s < o->steps && rc == 0; s++) {
        /* The dump's collective hook finds the harness through ex->user. */
        if (cp_harness_begin_step(&cs.harness, s)) { rc = 2; break; }
        ex->user = &cs;
        int run;
        if (o->graph) run = (s == 0 && cp_gpu_graph_capture(g, S)) || cp_gpu_graph_launch(g, S);
        else run = cp_gpu_step(g, S);
        if (run || cp_gpu_synchronize(g, S, o->timeout_s) || cp_harness_end_step(&cs.harness)) rc = 2;
    }
    if (rc == 0 && cp_harness_finish(&cs.harness)) rc = 2;
    if (rc == 2) fprintf(stderr, "commplan: %s\n", cp_gpu_last_error(g)[0] ? cp_gpu_last_error(g) : ex->err);
    else if (cs.harness.check.mismatches) {
        fprintf(stderr, "commplan: %s rank %d: %ld mismatching elements\n", p->name, cp_gpu_rank(g),
                cs.harness.check.mismatches);
        rc = 1;
    } else if (!o->quiet)
        printf("%s rank %d: --check passed for %d step(s)%s: unsharded params and reduced grads exact%s\n", p->name,
               cp_gpu_rank(g), o->steps, o->graph ? " replayed as one CUDA graph" : "",
               cp_plan_has_a2a(p) ? ", expert all-to-alls' counts and rows exact" : "");
    /* A failed step may leave host functions queued that read cs (a graph
     * replay's checks after an aborted collective): none may outlive it. */
    if (rc == 2 && cp_gpu_quiesce(g, S, o->timeout_s) != 0) {
        fprintf(stderr, "commplan: rank %d: the failed step's work is still queued after %.0f s; exiting without "
                "freeing what it uses\n", cp_gpu_rank(g), o->timeout_s);
        fflush(NULL);
        _exit(2);
    }
    cp_harness_free(&cs.harness);
    cp_gpu_set_compute(g, NULL, NULL);
    free(cs.calls);
    cudaFreeHost(cs.pinned);
    return rc;
out_err:
    cp_harness_free(&cs.harness);
    cp_gpu_set_compute(g, NULL, NULL);
    free(cs.calls);
    cudaFreeHost(cs.pinned);
    return 2;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Host time to issue one step (fn) from an idle GPU: the median over
 * iters, each started after a synchronize so the launch queue never fills
 * and the figure is the host's own cost, not the GPU's pace. */
static int host_us(cp_gpu *g, int (*fn)(cp_gpu *, void *), cudaStream_t S, int iters, double timeout_s, double *out)
{
    double *t = malloc((size_t)iters * sizeof *t);
    if (!t) return -1;
    for (int i = 0; i < iters; i++) {
        if (cp_gpu_synchronize(g, S, timeout_s)) { free(t); return -1; }
        double h0 = now_us();
        if (fn(g, S)) { free(t); return -1; }
        t[i] = now_us() - h0;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    *out = t[iters / 2];
    free(t);
    return cp_gpu_synchronize(g, S, timeout_s);
}

/* GPU time per step, steps issued back to back. */
static int gpu_ms(cp_gpu *g, int (*fn)(cp_gpu *, void *), cudaStream_t S, int iters, double timeout_s, double *out)
{
    cudaEvent_t t0, t1;
    if (cudaEventCreate(&t0) != cudaSuccess) return -1;
    if (cudaEventCreate(&t1) != cudaSuccess) { cudaEventDestroy(t0); return -1; }
    int rc = -1;
    float ms = 0.0f;
    if (cudaEventRecord(t0, S) != cudaSuccess) goto out;
    for (int i = 0; i < iters; i++)
        if (fn(g, S)) goto out;
    if (cudaEventRecord(t1, S) != cudaSuccess || cp_gpu_synchronize(g, S, timeout_s) ||
        cudaEventElapsedTime(&ms, t0, t1) != cudaSuccess)
        goto out;
    *out = ms / iters;
    rc = 0;
out:
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return rc;
}

/* --trace FILE: one eager step with a start and an end event around every
 * op on its stream (cp_gpu_set_trace; off the timed steps), written as
 * Chrome trace events in the shape of the plan's predicted trace.json: a
 * track per stream (tid = stream + 1), ts and dur in microseconds from the
 * step's start; pid 2 (the prediction is pid 1), so the two files' event
 * lists can be concatenated and laid side by side in Perfetto. */
static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int write_trace(cp_gpu *g, const cp_plan *p, const cp_gpu_run_options *o, cudaStream_t S)
{
    int n = p->nops, made = 0, rc = 2;
    cudaEvent_t *ev = calloc((size_t)2 * n + 1, sizeof *ev);
    FILE *f = NULL;
    cp_out out = { 0 }; /* a temporary beside the file, renamed over it when complete (safeio.h) */
    char err[8192];
    if (!ev) { fprintf(stderr, "commplan: --trace: out of host memory\n"); return 2; }
    for (; made < 2 * n + 1; made++)
        if (cudaEventCreate(&ev[made]) != cudaSuccess) { fprintf(stderr, "commplan: --trace: cudaEventCreate failed\n"); goto out; }
    if (cp_gpu_synchronize(g, S, o->timeout_s) || cudaEventRecord(ev[2 * n], S) != cudaSuccess) goto gpu_fail;
    cp_gpu_set_trace(g, ev);
    int step_rc = cp_gpu_step(g, S);
    cp_gpu_set_trace(g, NULL);
    if (step_rc || cp_gpu_synchronize(g, S, o->timeout_s)) goto gpu_fail;
    if (cp_out_open_path(&out, o->trace_file, 0666, err, sizeof err) != 0) {
        cp_error("--trace %s: %s", o->trace_file, err);
        goto out;
    }
    f = out.f;
    float end_ms = 0;
    for (int i = 0; i < n; i++) {
        float t1;
        if (cudaEventElapsedTime(&t1, ev[2 * n], ev[2 * i + 1]) != cudaSuccess) goto gpu_fail;
        if (t1 > end_ms) end_ms = t1;
    }
    fprintf(f, "{\"otherData\": {\"generator\":\"commplan --trace (measured on the GPU)\",\"fingerprint\":");
    json_string(f, p->fingerprint);
    fprintf(f, ",\"plan\":");
    json_string(f, p->name);
    fprintf(f, ",\"kind\":\"measured\",\"rank\":%d,\"standin\":%s,\"step_us\":%.3f},\n\"displayTimeUnit\": \"ms\",\n"
               "\"traceEvents\": [\n", cp_gpu_rank(g), cp_gpu_is_standin(g) ? "true" : "false", 1e3 * end_ms);
    fprintf(f, "{\"ph\":\"M\",\"pid\":2,\"tid\":0,\"ts\":0,\"name\":\"process_name\",\"args\":{\"name\":"
               "\"commplan measured step: %s rank %d\"}}", p->name, cp_gpu_rank(g));
    for (int s = 0; s < CP_STREAM_COUNT; s++) {
        fprintf(f, ",\n{\"ph\":\"M\",\"pid\":2,\"tid\":%d,\"ts\":0,\"name\":\"thread_name\",\"args\":{\"name\":"
                   "\"stream %s\"}}", s + 1, cp_stream_name((cp_stream)s));
        fprintf(f, ",\n{\"ph\":\"M\",\"pid\":2,\"tid\":%d,\"ts\":0,\"name\":\"thread_sort_index\",\"args\":"
                   "{\"sort_index\":%d}}", s + 1, s + 1);
    }
    for (int i = 0; i < n; i++) {
        const cp_op *op = &p->ops[i];
        float t0, t1;
        if (cudaEventElapsedTime(&t0, ev[2 * n], ev[2 * i]) != cudaSuccess ||
            cudaEventElapsedTime(&t1, ev[2 * n], ev[2 * i + 1]) != cudaSuccess) goto gpu_fail;
        double ts = 1e3 * (double)t0, te = 1e3 * (double)t1;
        if (te < ts) te = ts;
        char name[320];
        snprintf(name, sizeof name, "%s %s", cp_op_kind_name(op->kind), p->units[op->unit].name);
        fprintf(f, ",\n{\"name\":");
        json_string(f, name);
        fprintf(f, ",\"cat\":\"measured\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":2,\"tid\":%d,"
                   "\"args\":{\"seq\":%d,\"unit\":", ts, te - ts, (int)op->stream + 1, i);
        json_string(f, p->units[op->unit].name);
        fprintf(f, "}}");
    }
    fprintf(f, "\n]}\n");
    f = NULL;
    if (cp_out_commit(&out, err, sizeof err) != 0) { cp_error("--trace %s: %s", o->trace_file, err); goto out; }
    if (!o->quiet) printf("# --trace: one measured step written to %s\n", o->trace_file);
    rc = 0;
    goto out;
gpu_fail:
    fprintf(stderr, "commplan: --trace: %s\n", cp_gpu_last_error(g)[0] ? cp_gpu_last_error(g) : "CUDA event failure");
out:
    if (f) cp_out_abort(&out); /* an incomplete trace is not left behind */
    for (int i = 0; i < made; i++) cudaEventDestroy(ev[i]);
    free(ev);
    return rc;
}

static int step_fn(cp_gpu *g, void *s) { return cp_gpu_step(g, s); }
static int graph_fn(cp_gpu *g, void *s) { return cp_gpu_graph_launch(g, s); }

static int run_timing(cp_gpu *g, const cp_plan *p, const cp_gpu_run_options *o, cudaStream_t S)
{
    int iters = o->iters > 0 ? o->iters : 1;
    double ms, us;
    for (int i = 0; i < o->warmup; i++)
        if (cp_gpu_step(g, S)) goto fail;
    if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
    if (o->trace_file) {
        int t = write_trace(g, p, o, S);
        if (t) return t;
    }
    printf("# %s rank %d: %d ops per step, %d units%s\n", p->name, cp_gpu_rank(g), p->nops, p->nunits,
           cp_gpu_is_standin(g) ? "; stand-in: one-rank communicators, GPU times are not the plan's" : "");
    printf("# host: median time to issue one step from an idle GPU; GPU: steps back to back\n");
    if (gpu_ms(g, step_fn, S, iters, o->timeout_s, &ms) || host_us(g, step_fn, S, iters, o->timeout_s, &us)) goto fail;
    printf("step (eager):  %10.3f ms on the GPU, %10.1f us host enqueue\n", ms, us);
    {
        /* Where the eager host time goes: per op kind, mean over iters. */
        double by_kind[CP_OP_KIND_COUNT + 1] = { 0 };
        int n_kind[CP_OP_KIND_COUNT] = { 0 };
        for (int i = 0; i < p->nops; i++) n_kind[p->ops[i].kind]++;
        for (int i = 0; i < iters; i++) {
            if (cp_gpu_synchronize(g, S, o->timeout_s) || cp_gpu_step_profiled(g, S, by_kind)) goto fail;
        }
        if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
        printf("# host issue time by op kind (eager, mean per step)\n#   %-15s %6s %10s %10s\n", "kind", "ops",
               "us/step", "us/op");
        for (int k = 0; k <= CP_OP_KIND_COUNT; k++) {
            if (k < CP_OP_KIND_COUNT && n_kind[k] == 0) continue;
            double per = by_kind[k] / iters;
            printf("    %-15s %6d %10.1f %10.2f\n", k < CP_OP_KIND_COUNT ? cp_op_kind_name((cp_op_kind)k) : "fork/join",
                   k < CP_OP_KIND_COUNT ? n_kind[k] : 1, per, per / (k < CP_OP_KIND_COUNT ? n_kind[k] : 1));
        }
    }
    if (o->graph) {
        if (cp_gpu_graph_capture(g, S)) goto fail;
        for (int i = 0; i < o->warmup; i++)
            if (cp_gpu_graph_launch(g, S)) goto fail;
        if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
        if (gpu_ms(g, graph_fn, S, iters, o->timeout_s, &ms) || host_us(g, graph_fn, S, iters, o->timeout_s, &us))
            goto fail;
        printf("step (graph):  %10.3f ms on the GPU, %10.1f us host launch\n", ms, us);
    }
    if (cp_gpu_bench_ops(g, S, o->warmup, iters, stdout)) goto fail;
    return 0;
fail:
    fprintf(stderr, "commplan: %s\n", cp_gpu_last_error(g)[0] ? cp_gpu_last_error(g) : "CUDA event or host memory failure");
    return 2;
}

int cp_gpu_run(const cp_plan *p, const cp_gpu_kernels *k, const cp_launch_env *env, const cp_gpu_run_options *o)
{
    cp_gpu *g;
    char err[512];
    if (o->graph && cp_plan_has_a2a(p)) {
        fprintf(stderr, "commplan: rank %d: --graph: plan %s has expert-parallel all-to-alls, whose split sizes are "
                "read back to the host every step: a CUDA graph cannot capture them; run without --graph\n",
                env->rank, p->name);
        return 2;
    }
    if (cp_gpu_init(&g, p, k, env, err, sizeof err) != 0) {
        cp_error("%s", err); /* one line, whatever bytes the environment held */
        return 2;
    }
    cudaStream_t S;
    if (cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "commplan: rank %d: cudaStreamCreate failed\n", env->rank);
        cp_gpu_destroy(g);
        return 2;
    }
    p = cp_gpu_executor(g)->plan; /* this rank's view: its TP class's tables */
    int rc = o->check ? run_check(g, p, o, S) : run_timing(g, p, o, S);
    cudaStreamDestroy(S);
    cp_gpu_destroy(g);
    return rc;
}
