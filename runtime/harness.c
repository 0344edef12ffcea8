/* Checks and dumps around one rank's executor; see harness.h. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

static void dump_mark(cp_harness *h, const char *phase)
{
    fprintf(h->dump, "%s{\"op\":\"mark\",\"what\":\"step%d_%s\"}", h->dump_first_log ? "" : ",\n", h->check.step,
            phase);
    h->dump_first_log = 0;
}

/* The recorder marks the backward when loss.backward() starts: before the
 * first op after the first micro-step's forwards (its prefetching
 * all-gathers included). */
static void mark_backward(cp_harness *h, const cp_executor *ex, const cp_op *op)
{
    if (!h->dump || h->marked_backward || op - ex->plan->ops < h->backward_from) return;
    dump_mark(h, "backward");
    h->marked_backward = 1;
}

/* Buffer k of unit u as host memory, where the backend's memory is (the
 * host backend: the checks read and write it in place); NULL otherwise. */
static void *in_place(const cp_executor *ex, int u, cp_buffer k)
{
    cp_backend *b = ex->backend;
    return b->host_ptr ? b->host_ptr(b, cp_executor_buffer(ex, u, k)) : NULL;
}

static int on_compute(void *user, cp_executor *ex, const cp_op *op)
{
    cp_harness *h = user;
    int u = op->unit;
    mark_backward(h, ex, op);
    const char *when = op->kind == CP_OP_FORWARD ? "unsharded param in forward" : "unsharded param in backward";
    void *mem = in_place(ex, u, CP_BUF_UNSHARDED);
    if (!cp_compute_reads_params(&ex->plan->units[u], op->kind)) { /* (no unsharded parameters to check) */
    } else if (mem) cp_checker_check_unsharded(&h->check, u, mem, when);
    else {
        if (cp_executor_read(ex, op->stream, u, CP_BUF_UNSHARDED, h->scratch)) { h->error = 1; return -1; }
        cp_checker_check_unsharded(&h->check, u, h->scratch, when);
    }
    if (op->kind != CP_OP_BACKWARD) return 0;
    /* (a part's backward, ChunkedLossWrapper's: its parameters' grads only) */
    if ((mem = in_place(ex, u, CP_BUF_GRADS))) {
        cp_checker_add_grads_part(&h->check, u, op->part_first, op->part_count, op->micro_step, mem);
        return 0;
    }
    /* Autograd's .grad: written by the unit's first backward of the step
     * (in table order: a pipeline schedule's own), accumulated after (the
     * checker reads the buffer back for that, and for a part's backward,
     * which leaves the other parameters' grads as they are). */
    if ((op->part_count > 0 || !cp_checker_grads_fresh(&h->check, u, op->micro_step)) &&
        cp_executor_read(ex, op->stream, u, CP_BUF_GRADS, h->scratch)) {
        h->error = 1;
        return -1;
    }
    cp_checker_add_grads_part(&h->check, u, op->part_first, op->part_count, op->micro_step, h->scratch);
    if (cp_executor_write(ex, op->stream, u, CP_BUF_GRADS, h->scratch)) { h->error = 1; return -1; }
    return 0;
}

/* Around an activation collective (TP's, CP's K/V exchange): the input
 * written from the pattern, the output checked exactly, each through the
 * backend on the op's stream. */
static int on_activation(void *user, cp_executor *ex, const cp_op *op, int after)
{
    cp_harness *h = user;
    const cp_op_desc *d = &cp_op_descs[op->kind];
    int n, key;
    size_t es = cp_dtype_size(op->dtype);
    cp_backend *b = ex->backend;
    if (cp_checker_act_group(&h->check, op, &key, &n)) return 0; /* counted; the op runs unchecked */
    if (!after) {
        void *in = cp_executor_op_buffer(ex, op, d->in, d->in_slot);
        size_t len = (size_t)op->count * (op->kind == CP_OP_TP_REDUCE_SCATTER ? (size_t)n : 1);
        cp_checker_act_input(&h->check, op, key, n, h->scratch);
        return b->write(b, op->stream, in, h->scratch, len * es);
    }
    const void *out = cp_executor_op_buffer(ex, op, d->out, d->out_slot);
    size_t len = (size_t)op->count * (op->kind == CP_OP_TP_ALL_GATHER ? (size_t)n : 1);
    if (b->read(b, op->stream, out, h->scratch, len * es)) return -1;
    cp_checker_act_output(&h->check, op, key, n, h->scratch);
    return 0;
}

/* Around a pipeline message: before a send the message written from the
 * pattern (the caller's compute produced it), after a receive checked
 * against what the peer (cp_pp_peer_rank) wrote; a mismatch is counted and
 * named on one line. */
static int on_p2p(void *user, cp_executor *ex, const cp_op *op, int after)
{
    cp_harness *h = user;
    const cp_op_desc *d = &cp_op_descs[op->kind];
    size_t bytes = (size_t)op->count * cp_dtype_size(op->dtype);
    cp_backend *b = ex->backend;
    if (!after) {
        cp_checker_p2p_message(&h->check, op, ex->rank, h->scratch);
        return b->write(b, op->stream, cp_executor_op_buffer(ex, op, d->in, d->in_slot), h->scratch, bytes);
    }
    if (b->read(b, op->stream, cp_executor_op_buffer(ex, op, d->out, d->out_slot), h->scratch, bytes)) return -1;
    cp_checker_p2p_check(&h->check, op, cp_pp_peer_rank(ex->plan, ex->rank, op->peer), h->scratch);
    return 0;
}

/* Around expert parallelism's all-to-alls. A2A_COUNTS: before, this rank's
 * drawn counts given to the executor (refused there past capacity);
 * after, every member's counts for this rank's experts against that
 * member's draw. A2A: before, every input row written from the pattern;
 * after, every received row checked (its sender, expert, row and
 * elements: a wrong offset or split shows). Whole buffers go through the
 * backend (synchronous host copies: no CUDA graph has A2A ops). */
int cp_harness_on_a2a(void *user, cp_executor *ex, const cp_op *op, int after)
{
    cp_harness *h = user;
    const cp_plan *p = ex->plan;
    cp_backend *b = ex->backend;
    int n = 1, color = 0, key = 0;
    if (op->family >= 0) {
        n = p->families[op->family].size;
        cp_group_of(p, op->family, ex->rank, &color, &key);
    }
    int epp = op->a2a_experts, E = n * epp;
    int64_t *draw = malloc(((size_t)E + 1) * sizeof *draw);
    if (!draw) return -1;
    int rc = 0;
    if (op->kind == CP_OP_A2A_COUNTS) {
        if (!after) {
            cp_checker_a2a_counts(&h->check, op, ex->rank, n, draw);
            rc = cp_executor_set_expert_counts(ex, op->unit, draw, E);
        } else {
            const int64_t *got = cp_executor_a2a_counts(ex, op->unit, op->a2a_slot) + E;
            for (int m = 0; m < n && rc == 0; m++) {
                int peer = op->family >= 0 ? cp_group_member(p, op->family, color, m) : ex->rank;
                cp_checker_a2a_counts(&h->check, op, peer, n, draw);
                for (int e = 0; e < epp; e++)
                    if (got[m * epp + e] != draw[key * epp + e]) {
                        if (h->check.mismatches++ == 0)
                            fprintf(stderr, "commplan: mismatch: rank %d step %d: a2a_counts of unit %s, micro-step %d "
                                    "(op %ld): rank %d's count for expert %d: expected %lld, got %lld\n", ex->rank,
                                    h->check.step, p->units[op->unit].name, op->micro_step, (long)(op - p->ops), peer,
                                    key * epp + e, (long long)draw[key * epp + e], (long long)got[m * epp + e]);
                        break;
                    }
            }
        }
        free(draw);
        return rc;
    }
    free(draw);
    int64_t *send_rows = malloc(2 * (size_t)n * sizeof *send_rows);
    if (!send_rows) return -1;
    int64_t *recv_rows = send_rows + n;
    const cp_op *k = &p->ops[op->a2a_counts_op];
    const int64_t *sent = cp_executor_a2a_counts(ex, op->unit, k->a2a_slot), *got = sent + E;
    cp_buffer in = op->a2a_combine ? CP_BUF_A2A_RECV : CP_BUF_A2A_SEND;
    cp_buffer out = op->a2a_combine ? CP_BUF_A2A_SEND : CP_BUF_A2A_RECV;
    size_t row = (size_t)op->a2a_dim * cp_dtype_size(op->dtype);
    if (cp_executor_a2a_splits(ex, op, send_rows, recv_rows)) {
        free(send_rows);
        return -1;
    }
    /* dispatch: input rows for member m's experts, output from m for this rank's; a combine the reverse */
    const int64_t *in_counts = op->a2a_combine ? got : sent, *out_counts = op->a2a_combine ? sent : got;
    int64_t at = 0;
    if (!after) {
        char *buf = h->scratch;
        for (int m = 0; m < n; m++) {
            int peer = op->family >= 0 ? cp_group_member(p, op->family, color, m) : ex->rank;
            for (int e = 0; e < epp; e++) {
                int expert = op->a2a_combine ? key * epp + e : m * epp + e;
                for (int64_t r = 0; r < in_counts[m * epp + e]; r++, at++)
                    cp_checker_a2a_row(&h->check, op, ex->rank, peer, expert, r, buf + (size_t)at * row);
            }
        }
        rc = b->write(b, op->stream, ex->buf[in][op->unit], buf, (size_t)at * row);
    } else {
        for (int m = 0; m < n; m++) at += recv_rows[m];
        rc = b->read(b, op->stream, ex->buf[out][op->unit], h->scratch, (size_t)at * row);
        at = 0;
        for (int m = 0; m < n && rc == 0; m++) {
            int peer = op->family >= 0 ? cp_group_member(p, op->family, color, m) : ex->rank;
            int bad = 0;
            for (int e = 0; e < epp && !bad; e++) {
                int expert = op->a2a_combine ? m * epp + e : key * epp + e;
                for (int64_t r = 0; r < out_counts[m * epp + e] && !bad; r++, at++)
                    bad = cp_checker_a2a_check_row(&h->check, op, peer, ex->rank, expert, r, at,
                                                   (char *)h->scratch + (size_t)at * row) != 0;
            }
            if (bad) break;
        }
    }
    free(send_rows);
    return rc;
}

/* ---- dump in the recordings' format: step 0's shards, every step's
 * collectives between "stepN_forward" / "stepN_backward" marks (as the
 * recorder writes them), the last step's grads ---- */

static void dump_values(FILE *f, cp_dtype t, const void *base, int64_t off, int64_t n)
{
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) fprintf(f, "%s%.9g", i ? "," : "", (double)cp_load(t, base, off + i));
    fputc(']', f);
}

static const char *torch_dtype(cp_dtype t)
{
    return t == CP_FP32 ? "torch.float32" : t == CP_BF16 ? "torch.bfloat16" : t == CP_U8 ? "torch.uint8" : "torch.float16";
}

/* JSON string of a name: the plan's names are printable ASCII, but any
 * byte that JSON cannot hold raw is escaped. */
static void dump_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c < 0x20 || *c >= 0x7f) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}

static int dump_locals(cp_harness *h, cp_buffer k)
{
    cp_executor *ex = h->ex;
    const cp_plan *p = ex->plan;
    FILE *f = h->dump;
    fprintf(f, "\"%s\":{", k == CP_BUF_SHARDED_GRADS ? "grads_local" : "params_local");
    for (int u = 0, first = 1; u < p->nunits; u++) {
        const cp_unit *U = &p->units[u];
        if (cp_executor_read(ex, CP_STREAM_COMPUTE, u, k, h->scratch)) return -1;
        for (int j = 0; j < U->nparams; j++) {
            const cp_param *prm = &p->params[U->first_param + j];
            int grads = k == CP_BUF_SHARDED_GRADS;
            if (grads && prm->frozen) continue; /* (requires_grad=False: no grad, as in FSDP2) */
            fputs(first ? "" : ",", f);
            first = 0;
            dump_string(f, prm->name);
            fputs(":{\"values\":", f);
            dump_values(f, U->orig_dtype, h->scratch, grads ? cp_param_rs_offset(U, prm) : prm->offset,
                        cp_param_valid(prm, cp_unit_shard_rank(ex->plan, u, ex->rank)));
            fputc('}', f);
        }
    }
    fputc('}', f);
    return 0;
}

void cp_harness_on_collective(void *user, cp_executor *ex, const cp_op *op, const void *in, int64_t in_n,
                              const void *out, int64_t out_n)
{
    cp_harness *h = user;
    /* A one-rank group issues no collective (FSDP2 records none either). */
    if (!h->dump || op->family < 0) return;
    mark_backward(h, ex, op);
    const cp_plan *p = ex->plan;
    FILE *f = h->dump;
    int color, key;
    cp_group_of(p, op->family, ex->rank, &color, &key);
    fprintf(f, "%s{\"op\":\"%s\",\"unit\":", h->dump_first_log ? "" : ",\n", cp_op_kind_name(op->kind));
    dump_string(f, p->units[op->unit].name);
    fputs(",\"ranks\":[", f);
    h->dump_first_log = 0;
    for (int m = 0; m < p->families[op->family].size; m++)
        fprintf(f, "%s%d", m ? "," : "", cp_group_member(p, op->family, color, m));
    fprintf(f, "],\"dtype\":\"%s\"", torch_dtype(op->dtype));
    if (op->kind != CP_OP_ALL_GATHER) fprintf(f, ",\"reduce_op\":\"RedOpType.%s\"", op->reduce_op == CP_AVG ? "AVG" : op->reduce_op == CP_MAX ? "MAX" : op->reduce_op == CP_PREMUL_SUM ? "PREMUL_SUM" : "SUM");
    fprintf(f, ",\"in_numel\":%ld,\"out_numel\":%ld,\"in\":", (long)in_n, (long)out_n);
    dump_values(f, op->dtype, in, 0, in_n);
    fputs(",\"out\":", f);
    dump_values(f, op->dtype, out, 0, out_n);
    fputc('}', f);
}

int cp_harness_init(cp_harness *h, cp_executor *ex, cp_pattern pattern)
{
    memset(h, 0, sizeof *h);
    const cp_plan *p = ex->plan;
    size_t biggest = 0;
    for (int u = 0; u < p->nunits; u++)
        for (int k = 0; k < CP_BUFFERS; k++) {
            size_t n = (size_t)cp_arena_buffer_bytes(p, u, (cp_buffer)k);
            if (n > biggest) biggest = n;
        }
    h->ex = ex;
    h->scratch = calloc(1, biggest ? biggest : 1);
    if (!h->scratch || cp_checker_init(&h->check, p, pattern, ex->rank) != 0) {
        fprintf(stderr, "commplan: out of host memory for rank %d's checks\n", ex->rank);
        free(h->scratch);
        h->scratch = NULL;
        return -1;
    }
    ex->on_compute = on_compute;
    ex->on_activation = on_activation;
    ex->on_p2p = on_p2p;
    ex->on_a2a = cp_harness_on_a2a;
    ex->user = h;
    return 0;
}

void cp_harness_free(cp_harness *h)
{
    if (h->dump) cp_out_abort(&h->dump_out); /* a run that did not finish writes no dump */
    if (h->ex && h->ex->user == h) {
        h->ex->on_compute = NULL;
        h->ex->on_collective = NULL;
        h->ex->on_activation = NULL;
        h->ex->on_p2p = NULL;
        h->ex->on_a2a = NULL;
        h->ex->user = NULL;
    }
    cp_checker_free(&h->check);
    free(h->scratch);
    memset(h, 0, sizeof *h);
}

int cp_harness_open_dump(cp_harness *h, const char *dir)
{
    /* mkdir -p: every rank may race here, so EEXIST is fine. */
    char tmp[4096], err[8192];
    struct stat st;
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) {
        cp_error("--dump %s: path too long", dir);
        return -1;
    }
    for (char *s = tmp + 1;; s++) {
        int end = *s == '\0';
        if (*s == '/' || end) {
            *s = '\0';
            if (tmp[0] && mkdir(tmp, 0777) != 0 && errno != EEXIST) {
                /* strerror: every rank opens its dump before any rank thread starts */
                cp_error("--dump %s: cannot create directory %s: %s", dir, tmp, strerror(errno));
                return -1;
            }
            if (end) break;
            *s = '/';
        }
    }
    if (stat(dir, &st) != 0) {
        cp_error("--dump %s: %s; give a directory (created if missing)", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        cp_error("--dump %s is %s, not a directory; give a directory (created if missing)", dir,
                 cp_file_kind(st.st_mode));
        return -1;
    }
    char name[512];
    snprintf(name, sizeof name, "%s.rank%d.json", h->ex->plan->name, h->ex->rank);
    if (cp_out_open(&h->dump_out, dir, name, 0666, err, sizeof err) != 0) {
        cp_error("--dump %s: rank %d: %s; give a directory this process can write", dir, h->ex->rank, err);
        return -1;
    }
    h->dump = h->dump_out.f;
    /* Only a dump observes collectives (each observation copies buffers). */
    h->ex->on_collective = cp_harness_on_collective;
    const cp_plan *p = h->ex->plan;
    for (int i = 0; i < p->nops; i++)
        if (p->ops[i].kind == CP_OP_FORWARD && p->ops[i].micro_step == 0) h->backward_from = i + 1;
    return 0;
}

int cp_harness_begin_step(cp_harness *h, int step)
{
    cp_executor *ex = h->ex;
    const cp_plan *p = ex->plan;
    h->check.step = step;
    for (int u = 0; u < p->nunits; u++) {
        void *mem = in_place(ex, u, CP_BUF_SHARDED);
        cp_checker_fill_shards(&h->check, u, mem ? mem : h->scratch);
        if (!mem && cp_executor_write(ex, CP_STREAM_COMPUTE, u, CP_BUF_SHARDED, h->scratch)) return -1;
        /* Poisoned: a view-out that skips an element shows up in the check. */
        size_t bytes = (size_t)cp_arena_buffer_bytes(p, u, CP_BUF_SHARDED_GRADS);
        if ((mem = in_place(ex, u, CP_BUF_SHARDED_GRADS))) { memset(mem, CP_POISON_BYTE, bytes); continue; }
        memset(h->scratch, CP_POISON_BYTE, bytes);
        if (cp_executor_write(ex, CP_STREAM_COMPUTE, u, CP_BUF_SHARDED_GRADS, h->scratch)) return -1;
    }
    if (step == 0 && h->dump) {
        fprintf(h->dump, "{\"rank\":%d,\"world\":%d,\n", ex->rank, p->world_size);
        if (dump_locals(h, CP_BUF_SHARDED)) return -1;
        fputs(",\n\"log\":[\n", h->dump);
        h->dump_first_log = 1;
    }
    if (h->dump) {
        dump_mark(h, "forward");
        h->marked_backward = 0;
    }
    return 0;
}

int cp_harness_end_step(cp_harness *h)
{
    cp_executor *ex = h->ex;
    for (int u = 0; u < ex->plan->nunits; u++) {
        void *mem = in_place(ex, u, CP_BUF_SHARDED_GRADS);
        if (!mem && cp_executor_read(ex, CP_STREAM_COMPUTE, u, CP_BUF_SHARDED_GRADS, h->scratch)) return -1;
        cp_checker_check_grads(&h->check, u, mem ? mem : h->scratch);
    }
    return h->error ? -1 : 0;
}

int cp_harness_finish(cp_harness *h)
{
    if (!h->dump) return 0;
    fputs("],\n", h->dump);
    if (dump_locals(h, CP_BUF_SHARDED_GRADS)) return -1;
    fputs("}\n", h->dump);
    /* Every write checked (a full disk shows here), then renamed into place. */
    char err[8192];
    h->dump = NULL;
    if (cp_out_commit(&h->dump_out, err, sizeof err) != 0) {
        cp_error("--dump: rank %d: %s; free space there or dump elsewhere", h->ex->rank, err);
        return -1;
    }
    return 0;
}
