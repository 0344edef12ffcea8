/* The copy kernels (runtime/cp_kernels.cuh, cp_kernels.cu and each plan's
 * generated plan_kernels.cu) built with g++ against a stand-in CUDA header
 * (tests/c/kernel_standin/: a test double, see there) and run on the host:
 * every copy op of every small plan (every plans/<name>.lua but llama8b,
 * llama70b and llama405b, and tests/plans/kernels_all_dtypes.lua and
 * kernels_big.lua), for every rank (so every TP class and shard rank), on
 * the plan's real arena layout, compared byte for byte with the host
 * backend's copies (the reference).
 *
 * For each (op, rank): the rank's arena (arena_bytes, buffers at the
 * generator's offsets, 256-byte aligned as cudaMalloc gives) and the
 * persistent shard buffers (each its own 256-byte aligned allocation), all
 * inside guard zones. The output is poisoned (CP_POISON_BYTE), the input
 * filled with element-unique, never-zero values, every other byte (guards,
 * the rest of the arena) hashed background. The reference and the kernel
 * run on two copies of that state; afterwards the whole state (arena,
 * buffers, guards) must be equal, and the reference must have written
 * nothing but its output. On units with vec_ok, every vectorised piece's
 * start (and row stride) must have the alignment the device's vector loads
 * and stores need; in the "device words" build (-D__CUDA_ARCH__
 * -DCP_KHOST_DEVICE_WORDS, the ASan one) the kernels take their device
 * load/store branch and every uint2/uint4 access is checked as it happens.
 *
 * Also: the same with every unit's pre/post divide factors set to values
 * that are not powers of two (and, once, the grads kept in the all-gather
 * dtype), so the fp16/bf16 rounding order shows; and negative tests: one
 * offset (or grad_offset) moved by one element in a copy of the tables the
 * kernels read must fail the comparison, on a vector unit the alignment
 * check must flag it too, and one moved past the output's end must be seen
 * writing outside the output. */
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "commplan.h"
#include "cp_gpu_kernels.h"
#include "host.h"

/* plans.def (written by the Makefile): CP_KHOST_PLAN(name) per plan. */
#define CP_KHOST_PLAN(n) extern "C" const cp_plan n##_plan; extern "C" const cp_gpu_kernels n##_kernels;
#include "khost_plans.def"
#undef CP_KHOST_PLAN

struct plan_entry {
    const char *name;
    const cp_plan *plan;
    const cp_gpu_kernels *k;
};
static const plan_entry PLANS[] = {
#define CP_KHOST_PLAN(n) { #n, &n##_plan, &n##_kernels },
#include "khost_plans.def"
#undef CP_KHOST_PLAN
};
static const int NPLANS = (int)(sizeof PLANS / sizeof PLANS[0]);

static const size_t GUARD = 256; /* bytes of guard zone on each side of every buffer */
static const size_t DEVICE_ALIGN = 256; /* cudaMalloc's alignment */

static int failures;

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    failures++;
}

/* ---- device words (the "device words" build only) ---- */
static long long words_checked, words_misaligned;
static const void *first_misaligned;
#ifdef CP_KHOST_DEVICE_WORDS
void cp_khost_word(const void *dst, const void *src, unsigned bytes)
{
    uintptr_t need = bytes < 16 ? bytes : 16;
    words_checked++;
    if ((uintptr_t)dst % need || (uintptr_t)src % need) {
        if (!words_misaligned) first_misaligned = (uintptr_t)dst % need ? dst : src;
        words_misaligned++;
    }
}
static const bool DEVICE_WORDS = true;
#else
static const bool DEVICE_WORDS = false;
#endif

/* ---- values ---- */
static uint32_t mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* n elements of dtype t, never zero, magnitudes in [2^-4, 2^8) (finite in
 * every dtype, away from the poison's value), the sign and binade hashed
 * from the index, the mantissa an odd multiple of the index: fp32 values
 * are all distinct (for up to 2^23 elements), bf16 / fp16 ones distinct
 * within any 128 / 1024 consecutive elements. Full fp32 mantissas make
 * every cast and every divide by a non-power of two round. */
static void fill(cp_dtype t, void *buf, int64_t n, uint32_t salt)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t h = mix32((uint32_t)i * 0x9e3779b9u ^ salt), k = (uint32_t)i * 0x2545f491u + salt;
        uint32_t sign = (h >> 8) & 1u;
        int e = (int)(h % 12u) - 4;
        if (t == CP_FP32) {
            uint32_t u = sign << 31 | (uint32_t)(127 + e) << 23 | (k & 0x7fffffu);
            memcpy((char *)buf + 4 * i, &u, 4);
        } else {
            uint16_t u = t == CP_BF16 ? (uint16_t)(sign << 15 | (uint32_t)(127 + e) << 7 | (k & 0x7fu))
                                      : (uint16_t)(sign << 15 | (uint32_t)(15 + e) << 10 | (k & 0x3ffu));
            memcpy((char *)buf + 2 * i, &u, 2);
        }
    }
}

/* ---- buffers: 256-byte aligned, guard zones either side ----
 * Everything but the op's input and output (the guards, the rest of the
 * arena) holds "background": hashed bytes, never periodic, so a stray write
 * shows even when it copies bytes from elsewhere in the arena. The output
 * is poisoned (CP_POISON_BYTE), the input filled (fill()). */
static std::vector<unsigned char> background;
static const unsigned char *background_at(size_t skew, size_t n)
{
    if (background.size() < skew + n) {
        size_t old = background.size();
        background.resize(skew + n + (1u << 20));
        for (size_t i = old; i < background.size(); i++) background[i] = (unsigned char)(mix32((uint32_t)i ^ 0x2f6b3c1du) >> 24);
    }
    return background.data() + skew;
}

struct region {
    unsigned char *mem = nullptr; /* GUARD | bytes (rounded up to 256) | GUARD */
    size_t total = 0, bytes = 0, cap = 0;
    unsigned char *base() const { return mem + GUARD; }
    void alloc(size_t n) /* reuses the last allocation when it is big enough */
    {
        bytes = n;
        total = GUARD + (n + DEVICE_ALIGN - 1) / DEVICE_ALIGN * DEVICE_ALIGN + GUARD;
        if (total <= cap) return;
        free(mem);
        mem = (unsigned char *)aligned_alloc(DEVICE_ALIGN, total);
        cap = total;
        if (!mem) {
            fprintf(stderr, "out of memory (%zu bytes)\n", total);
            exit(2);
        }
    }
    void drop() { bytes = total = 0; }
    void reset(size_t skew) /* background everywhere */ { memcpy(mem, background_at(skew, total), total); }
    void copy_from(const region &o) { memcpy(mem, o.mem, total); }
    ~region() { free(mem); }
};

/* ---- copies of a plan's tables (kept to the end: cp_kernels.cu caches a
 * plan's kernel tables by its address) ---- */
struct plan_clone {
    cp_plan plan;
    std::vector<cp_tp_class> classes;
    std::vector<std::vector<cp_unit>> units;
    std::vector<std::vector<cp_param>> params;
};
static std::deque<plan_clone> clones;

static plan_clone &clone_plan(const cp_plan *p)
{
    clones.emplace_back();
    plan_clone &c = clones.back();
    c.plan = *p;
    int nc = p->nclasses > 0 && p->classes ? p->nclasses : 1;
    c.units.resize((size_t)nc);
    c.params.resize((size_t)nc);
    for (int k = 0; k < nc; k++) {
        const cp_unit *u = p->classes ? p->classes[k].units : p->units;
        const cp_param *q = p->classes ? p->classes[k].params : p->params;
        c.units[(size_t)k].assign(u, u + p->nunits);
        c.params[(size_t)k].assign(q, q + p->nparams);
    }
    if (p->classes) {
        c.classes.assign(p->classes, p->classes + nc);
        for (int k = 0; k < nc; k++) {
            c.classes[(size_t)k].units = c.units[(size_t)k].data();
            c.classes[(size_t)k].params = c.params[(size_t)k].data();
        }
        c.plan.classes = c.classes.data();
    }
    c.plan.units = c.units[0].data();
    c.plan.params = c.params[0].data();
    return c;
}

/* ---- one copy op on one rank ---- */
static const char *const KNAMES[7] = { "copy_in", "copy_out", "pack", "view_out", "view_out_add", "flat_copy", "flat_add" };
/* all_reduce_last's partial sums: the whole unit, reduce dtype -> reduce dtype. */
static bool is_flat(int kernel)
{
#if CP_TABLES_VERSION >= 6
    return kernel == CP_KERNEL_FLAT_COPY || kernel == CP_KERNEL_FLAT_ADD;
#else
    (void)kernel;
    return false;
#endif
}
/* The view-outs (assigning, or adding into the sharded grads): the whole unit, reduce dtype -> orig; and the
 * flat copies, also one piece over the whole unit. */
static bool is_view_out(int kernel) { return kernel == CP_KERNEL_VIEW_OUT || kernel == CP_KERNEL_VIEW_OUT_ADD || is_flat(kernel); }

struct tally {
    long long checks, mismatched, stray_ops, out_bytes, bytes_compared, pieces, misaligned_pieces, words, misaligned_words;
    long long own_group; /* checks of units sharded over their own group (experts units: efsdp, not the plan's) */
};

static bool in_arena(cp_buffer k) { return k < CP_ARENA_BUFFERS; }

/* The unsharded grads' dtype: cp_unit.grad_dtype from table version 4
 * (the packing's input), the all-gather dtype before it. */
static cp_dtype grads_dtype(const cp_unit *U)
{
#if CP_TABLES_VERSION >= 4
    return U->grad_dtype;
#else
    return U->ag_dtype;
#endif
}

static cp_dtype buf_dtype(const cp_unit *U, cp_buffer k)
{
    switch (k) {
    case CP_BUF_GRADS: return grads_dtype(U);
    case CP_BUF_SHARDED:
    case CP_BUF_SHARDED_GRADS: return U->orig_dtype;
    case CP_BUF_RS_IN:
#if CP_TABLES_VERSION >= 6
    case CP_BUF_PARTIAL:
#endif
    case CP_BUF_RS_OUT: return U->reduce_dtype;
    default: return U->ag_dtype;
    }
}

static double load(cp_dtype t, const unsigned char *p) { return (double)cp_load(t, p, 0); }

/* The parameter holding element j of a unit's slot (total elements). */
static const cp_param *param_at(const cp_plan *v, const cp_unit *U, int64_t j)
{
    for (int i = 0; i < U->nparams; i++) {
        const cp_param *q = &v->params[U->first_param + i];
        if (j >= q->offset && j < q->offset + q->padded) return q;
    }
    return nullptr;
}

/* Where output element e of the op lives, in the plan's terms. */
static std::string where(const cp_plan *v, const cp_unit *U, int kernel, int64_t e)
{
    char s[256];
    int64_t W = cp_unit_shard_size(v, (int)(U - v->units)); /* the unit's own group (an experts unit's efsdp) */
    const cp_param *q;
    if (kernel == CP_KERNEL_COPY_OUT) {
        for (int i = 0; i < U->nparams; i++) {
            q = &v->params[U->first_param + i];
            int64_t l = e - W * q->offset;
            if (l >= 0 && l < W * q->padded) {
                snprintf(s, sizeof s, "%s row %lld, rank %lld's run, element %lld", q->name, (long long)(l / (W * q->run)),
                         (long long)(l % (W * q->run) / q->run), (long long)(l % q->run));
                return s;
            }
        }
        return "no parameter";
    }
    int64_t r = is_view_out(kernel) ? 0 : e / U->total, j = is_view_out(kernel) ? e : e % U->total;
    q = param_at(v, U, j);
    if (!q) return "no parameter";
    snprintf(s, sizeof s, "slot %lld, %s element %lld (row %lld)", (long long)r, q->name, (long long)(j - q->offset),
             (long long)((j - q->offset) / q->run));
    return s;
}

/* Every vectorised piece's source and destination (and row strides) are
 * aligned as the device's V-element loads and stores need: min(16, V *
 * element size) bytes, V = 16 bytes of the output dtype. Pieces as
 * cp_kernels.cuh cuts them: the whole unit for copy-in and view-out,
 * (rank slot r, parameter p) for copy-out and packing. */
static void check_pieces(const cp_plan *v, int u, int kernel, int shard_rank, const unsigned char *in,
                         const unsigned char *out, tally &t, std::string &bad)
{
    const cp_unit *U = &v->units[u];
    if (!U->vec_ok) return;
    cp_dtype ti = kernel == CP_KERNEL_COPY_IN    ? U->orig_dtype
                  : is_view_out(kernel)          ? U->reduce_dtype
                  : kernel == CP_KERNEL_PACK     ? grads_dtype(U)
                                                 : U->ag_dtype;
    cp_dtype to = kernel == CP_KERNEL_COPY_IN || kernel == CP_KERNEL_COPY_OUT ? U->ag_dtype
                  : kernel == CP_KERNEL_PACK || is_flat(kernel)              ? U->reduce_dtype
                                                                             : U->orig_dtype;
    size_t ei = cp_dtype_size(ti), eo = cp_dtype_size(to), V = 16 / eo;
    size_t ai = V * ei < 16 ? V * ei : 16, ao = 16;
    int64_t W = cp_unit_shard_size(v, u);
    auto piece = [&](const unsigned char *src, const unsigned char *dst, int64_t src_row, int64_t dst_row, int64_t outer,
                     const char *what) {
        t.pieces++;
        bool ok = (uintptr_t)src % ai == 0 && (uintptr_t)dst % ao == 0 &&
                  (outer <= 1 || ((size_t)src_row * ei % ai == 0 && (size_t)dst_row * eo % ao == 0));
        if (!ok) {
            t.misaligned_pieces++;
            if (bad.empty()) {
                char s[256];
                snprintf(s, sizeof s, "%s: source %% %zu = %zu, destination %% %zu = %zu", what, ai,
                         (size_t)((uintptr_t)src % ai), ao, (size_t)((uintptr_t)dst % ao));
                bad = s;
            }
        }
    };
    if (kernel == CP_KERNEL_COPY_IN) piece(in, out + (size_t)shard_rank * U->total * eo, 0, 0, 1, "the unit");
    else if (is_view_out(kernel)) piece(in, out, 0, 0, 1, "the unit");
    else
        for (int i = 0; i < U->nparams; i++) {
            const cp_param *q = &v->params[U->first_param + i];
            for (int64_t r = 0; r < W; r++) {
                if (kernel == CP_KERNEL_COPY_OUT)
                    piece(in + (size_t)(r * U->total + q->offset) * ei, out + (size_t)(W * q->offset + r * q->run) * eo,
                          q->run, W * q->run, q->outer, q->name);
                else
                    piece(in + (size_t)(q->grad_offset + r * q->run) * ei, out + (size_t)(r * U->total + q->offset) * eo,
                          W * q->run, q->run, q->outer, q->name);
            }
        }
}

struct check_ctx {
    const char *plan, *variant;
    const cp_plan *ref_plan;     /* the host reference's tables */
    const cp_plan *ker_plan;     /* the tables the kernels read (a shifted copy in the negative tests) */
    const cp_gpu_kernels *k;     /* the plan's own binding (plan_kernels.cu), or null: cp_kernels_emulate(ker_plan) */
    cp_host_world *world;
    bool expect_equal;           /* false: a negative test; a mismatch is what it wants */
};

/* Runs op `oi` of rank `rank` both ways; true when the kernel's state
 * equals the reference's (and the reference wrote only its output). */
static bool check_op(const check_ctx &c, int rank, int oi, tally &t, std::string *diff)
{
    cp_plan view, kview;
    cp_plan_view(c.ref_plan, rank, &view);
    cp_plan_view(c.ker_plan, rank, &kview);
    const cp_op *op = &view.ops[oi];
    const cp_op_desc *d = &cp_op_descs[op->kind];
    int u = op->unit, kernel = d->kernel, sr = cp_unit_shard_rank(&view, u, rank);
    const cp_unit *U = &view.units[u];
    size_t in_bytes = (size_t)cp_arena_buffer_bytes(&view, u, d->in), out_bytes = (size_t)cp_arena_buffer_bytes(&view, u, d->out);
    cp_dtype in_t = buf_dtype(U, d->in), out_t = buf_dtype(U, d->out);

    /* The real layout: arena buffers at their offsets, shards on their own. */
    static region arena[3], pin[3], pout[3]; /* expected start, reference, kernel */
    for (int s = 0; s < 3; s++) {
        arena[s].alloc((size_t)(view.arena_bytes > 0 ? view.arena_bytes : 1));
        if (!in_arena(d->in)) pin[s].alloc(in_bytes ? in_bytes : 16);
        else pin[s].drop();
        if (!in_arena(d->out)) pout[s].alloc(out_bytes ? out_bytes : 16);
        else pout[s].drop();
    }
    auto in_at = [&](int s) { return in_arena(d->in) ? arena[s].base() + U->arena_offset[d->in] : pin[s].base(); };
    auto out_at = [&](int s) { return in_arena(d->out) ? arena[s].base() + U->arena_offset[d->out] : pout[s].base(); };
    if (in_arena(d->in) && in_arena(d->out)) {
        int64_t a = U->arena_offset[d->in], b = U->arena_offset[d->out];
        if (in_bytes && out_bytes && a < b + (int64_t)out_bytes && b < a + (int64_t)in_bytes)
            fail("%s rank %d op %d (%s unit %s): its input and output overlap in the arena", c.plan, rank, oi,
                 KNAMES[kernel], U->name);
    }
    if ((in_arena(d->in) && U->arena_offset[d->in] + (int64_t)in_bytes > view.arena_bytes) ||
        (in_arena(d->out) && U->arena_offset[d->out] + (int64_t)out_bytes > view.arena_bytes)) {
        fail("%s rank %d op %d (%s unit %s): a buffer ends past the arena", c.plan, rank, oi, KNAMES[kernel], U->name);
        return false;
    }
    arena[0].reset(0);
    if (!in_arena(d->in)) pin[0].reset(1021);
    if (!in_arena(d->out)) pout[0].reset(2039);
    memset(out_at(0), CP_POISON_BYTE, out_bytes);
    fill(in_t, in_at(0), (int64_t)(in_bytes / cp_dtype_size(in_t)), mix32((uint32_t)(rank * 7919 + oi) ^ 0x51ed270bu));
    for (int s = 1; s < 3; s++) {
        arena[s].copy_from(arena[0]);
        if (!in_arena(d->in)) pin[s].copy_from(pin[0]);
        if (!in_arena(d->out)) pout[s].copy_from(pout[0]);
    }

    cp_backend b;
    cp_host_backend_init(&b, c.world, rank);
    /* (a partial reduction's pack or view-out: its part of the unit, both ways) */
    if (b.copy(&b, kernel, u, op->part_first, op->part_count, CP_STREAM_COMPUTE, in_at(1), out_at(1)) != 0) {
        fail("%s rank %d op %d: the host reference's copy failed", c.plan, rank, oi);
        return false;
    }
    std::string misaligned;
    check_pieces(&kview, u, kernel, sr, in_at(2), out_at(2), t, misaligned);
    long long w0 = words_checked, m0 = words_misaligned;
    int rc = c.k ? c.k->emulate(kview.view_class, kernel, u, op->part_first, op->part_count, sr, in_at(2), out_at(2))
                 : cp_kernels_emulate(c.ker_plan, kview.view_class, kernel, u, op->part_first, op->part_count, sr,
                                      in_at(2), out_at(2));
    t.words += words_checked - w0;
    t.misaligned_words += words_misaligned - m0;
    if (DEVICE_WORDS && words_misaligned > m0 && misaligned.empty()) {
        char s[128];
        snprintf(s, sizeof s, "device word at %p (%% 16 = %zu)", first_misaligned, (size_t)((uintptr_t)first_misaligned % 16));
        misaligned = s;
    }
    t.checks++;
    if (cp_unit_shard_size(&view, u) != view.shard_size) t.own_group++;
    t.out_bytes += (long long)out_bytes;

    /* The reference wrote its output only. */
    const unsigned char *outs[3] = { out_at(0), out_at(1), out_at(2) };
    auto outside_out = [&](const region *r, int s, size_t i) {
        const unsigned char *p = r[s].mem + i;
        return !(p >= outs[s] && p < outs[s] + out_bytes);
    };
    for (const region *r : { arena, pin, pout }) {
        if (!r[0].total) continue;
        /* the output lies in one region: memcmp around it, bytes only when that differs */
        size_t o = outs[1] >= r[1].mem && outs[1] < r[1].mem + r[1].total ? (size_t)(outs[1] - r[1].mem) : r[1].total;
        size_t oe = o < r[1].total ? o + out_bytes : r[1].total;
        if (!memcmp(r[1].mem, r[0].mem, o) && !memcmp(r[1].mem + oe, r[0].mem + oe, r[1].total - oe)) continue;
        for (size_t i = 0; i < r[0].total; i++)
            if (r[1].mem[i] != r[0].mem[i] && outside_out(r, 1, i)) {
                fail("%s%s rank %d op %d (%s unit %s): the host reference wrote byte %lld outside its output", c.plan,
                     c.variant, rank, oi, KNAMES[kernel], U->name, (long long)i - (long long)GUARD);
                break;
            }
    }

    /* The kernel's whole state against the reference's. */
    long long ndiff = 0, stray = 0;
    std::string first;
    for (const region *r : { arena, pin, pout }) {
        if (!r[0].total) continue;
        t.bytes_compared += (long long)r[0].total;
        if (!memcmp(r[2].mem, r[1].mem, r[0].total)) continue;
        for (size_t i = 0; i < r[0].total; i++) {
            if (r[2].mem[i] == r[1].mem[i]) continue;
            ndiff++;
            bool out = !outside_out(r, 2, i);
            if (!out) stray++;
            if (!first.empty()) continue;
            char s[512];
            if (out) {
                size_t es = cp_dtype_size(out_t);
                int64_t e = (int64_t)((size_t)(r[2].mem + i - outs[2]) / es);
                snprintf(s, sizeof s, "output element %lld (%s): kernel %.9g, host %.9g", (long long)e,
                         where(&view, U, kernel, e).c_str(), load(out_t, outs[2] + (size_t)e * es),
                         load(out_t, outs[1] + (size_t)e * es));
            } else {
                const unsigned char *p = r[2].mem + i;
                snprintf(s, sizeof s, "stray write at byte %lld from the output's start (%s)",
                         (long long)(p - outs[2]),
                         r == arena ? (i < GUARD || i >= GUARD + r[0].bytes ? "the arena's guard zone" : "elsewhere in the arena")
                                    : r == pin ? "the input's buffer" : "the output buffer's guard zone");
            }
            first = s;
        }
    }
    bool equal = ndiff == 0 && rc == 0;
    if (!equal) t.mismatched++;
    if (stray) t.stray_ops++;
    char head[512];
    snprintf(head, sizeof head, "%s%s rank %d (TP class %d, shard rank %d) op %d %s unit %d %s (%s -> %s, pre %g post %g, %s)",
             c.plan, c.variant, rank, view.view_class, sr, oi, KNAMES[kernel], u, U->name, cp_dtype_name(in_t),
             cp_dtype_name(out_t), U->pre_divide, U->post_divide, U->vec_ok ? "vector" : "scalar");
    if (!equal) {
        std::string msg = std::string(head) + ": rc " + std::to_string(rc) + ", " + std::to_string(ndiff) +
                          " bytes differ (" + std::to_string(stray) + " outside the output); first: " + first;
        if (diff) *diff = msg;
        if (c.expect_equal) fail("%s", msg.c_str());
    }
    if (!misaligned.empty()) {
        std::string msg = std::string(head) + ": misaligned vector access, " + misaligned;
        if (diff) *diff += (diff->empty() ? "" : "; ") + msg;
        if (c.expect_equal) fail("%s", msg.c_str());
    }
    return equal && misaligned.empty();
}

/* Every copy op of every rank; kernels filtered by mask (bit k: kernel k). */
static void check_plan(const check_ctx &c, unsigned mask, tally &t)
{
    for (int rank = 0; rank < c.ref_plan->world_size; rank++) {
        cp_plan view;
        cp_plan_view(c.ref_plan, rank, &view);
        for (int oi = 0; oi < view.nops; oi++) {
            const cp_op_desc *d = &cp_op_descs[view.ops[oi].kind];
            if (d->action == CP_ACT_COPY && (mask >> d->kernel & 1u)) check_op(c, rank, oi, t, nullptr);
        }
    }
}

/* ---- the stand-in's conversions against runtime/dtype.c ---- */
#include "cuda_bf16.h"
#include "cuda_fp16.h"
static void check_standin_conversions(long long &n)
{
    for (uint32_t h = 0; h < 65536; h++) {
        __half a;
        __nv_bfloat16 b;
        a.x = (unsigned short)h;
        b.x = (unsigned short)h;
        float fa = __half2float(a), fb = __bfloat162float(b), ra = cp_fp16_to_float((uint16_t)h),
              rb = cp_bf16_to_float((uint16_t)h);
        if ((fa == fa || ra == ra) && memcmp(&fa, &ra, 4)) fail("stand-in __half2float(0x%04x) = %a, dtype.c %a", h, fa, ra);
        if ((fb == fb || rb == rb) && memcmp(&fb, &rb, 4)) fail("stand-in __bfloat162float(0x%04x) = %a, dtype.c %a", h, fb, rb);
        n += 2;
    }
    /* Every fp32 of a thinned grid plus each fp16 value, its neighbours
     * and the midpoints around it (ties to even, subnormals, overflow). */
    auto one = [&](float f) {
        if (f != f) return;
        uint16_t a = __float2half_rn(f).x, ra = cp_float_to_fp16(f), b = __float2bfloat16_rn(f).x, rb = cp_float_to_bf16(f);
        if (a != ra) fail("stand-in __float2half_rn(%a) = 0x%04x, dtype.c 0x%04x", f, a, ra);
        if (b != rb) fail("stand-in __float2bfloat16_rn(%a) = 0x%04x, dtype.c 0x%04x", f, b, rb);
        n += 2;
    };
    for (uint64_t u = 0; u < (1ull << 32); u += 997) {
        float f;
        uint32_t v = (uint32_t)u;
        memcpy(&f, &v, 4);
        one(f);
    }
    for (uint32_t h = 0; h < 0x7c00; h++) {
        __half a;
        a.x = (unsigned short)h;
        float f = __half2float(a);
        uint32_t v;
        memcpy(&v, &f, 4);
        for (int dv = -2; dv <= 2; dv++) {
            uint32_t w = v + (uint32_t)dv;
            float g;
            memcpy(&g, &w, 4);
            one(g);
            one(-g);
        }
        if (h < 0x7bff) {
            __half nx;
            nx.x = (unsigned short)(h + 1);
            float mid = (float)(((double)f + (double)__half2float(nx)) / 2);
            one(mid);
            one(-mid);
        }
    }
}

int main(void)
{
    tally all = {}, sweep = {};
    long long conversions = 0;
    if (!DEVICE_WORDS) check_standin_conversions(conversions); /* once is enough: the plain build */

    /* 1. Every copy op, every rank, every plan, the plan's own binding. */
    for (int i = 0; i < NPLANS; i++) {
        cp_host_world *w = cp_host_world_create(PLANS[i].plan);
        if (!w) return 2;
        check_ctx c = { PLANS[i].name, "", PLANS[i].plan, PLANS[i].plan, PLANS[i].k, w, true };
        check_plan(c, (1u << CP_KERNEL_COUNT) - 1u, all); /* every kernel */
        cp_host_world_destroy(w);
    }

    /* 2. Divide factors that are not powers of two on every unit (pack and
     * view-out are the ops that divide), kernels and reference on the
     * same copy of the tables. The third variant also keeps the unsharded
     * grads in the all-gather dtype (as without micro-steps) where the
     * plan has them in the reduce dtype, each unit's grads buffer moved
     * past the arena's end: fp32 grads packed into fp16/bf16, where the
     * cast and the pre-divide round in an order that matters. */
    struct variant {
        double pre, post;
        bool grads_in_ag;
    };
    static const variant VARIANTS[] = { { 3.0, 1.5, false }, { 1.5, 7.0, false }, { 3.0, 1.5, true } };
    long long grads_moved = 0;
    for (const variant &f : VARIANTS)
        for (int i = 0; i < NPLANS; i++) {
            plan_clone &pc = clone_plan(PLANS[i].plan);
            for (size_t k = 0; k < pc.units.size(); k++) {
#if CP_TABLES_VERSION >= 4
                int64_t *arena_bytes = pc.classes.empty() ? &pc.plan.arena_bytes : &pc.classes[k].arena_bytes;
#endif
                for (cp_unit &U : pc.units[k]) {
                    U.pre_divide = f.pre;
                    U.post_divide = f.post;
#if CP_TABLES_VERSION >= 4
                    if (f.grads_in_ag && U.grad_dtype != U.ag_dtype) {
                        U.grad_dtype = U.ag_dtype;
                        U.arena_offset[CP_BUF_GRADS] = (*arena_bytes + 255) / 256 * 256;
                        *arena_bytes = U.arena_offset[CP_BUF_GRADS] + U.grads_numel * (int64_t)cp_dtype_size(U.ag_dtype);
                        grads_moved++;
                    }
#endif
                }
            }
            if (!pc.classes.empty()) pc.plan.arena_bytes = pc.classes[0].arena_bytes;
            cp_host_world *w = cp_host_world_create(&pc.plan);
            if (!w) return 2;
            char label[96];
            snprintf(label, sizeof label, " (pre_divide %g, post_divide %g%s)", f.pre, f.post,
                     f.grads_in_ag ? ", grads in the all-gather dtype" : "");
            check_ctx c = { PLANS[i].name, label, &pc.plan, &pc.plan, nullptr, w, true };
            check_plan(c, f.grads_in_ag ? 1u << CP_KERNEL_PACK
                                        : (1u << CP_KERNEL_PACK | 1u << CP_KERNEL_VIEW_OUT | 1u << CP_KERNEL_VIEW_OUT_ADD),
                       sweep);
            cp_host_world_destroy(w);
        }

    /* 3. Negative: one offset shifted by one element in a copy of the
     * tables the kernels read (the reference keeps the plan's), in the
     * first scalar and the first vector unit with two or more parameters,
     * class 0's tables (the ranks of class 0 run it): parameter 1's offset
     * and grad_offset one element back (inside the unit's buffers), and
     * the last parameter's offset one element on (past the end of the
     * output: a stray write the comparison must see outside the output). */
    long long neg_runs = 0, neg_caught = 0, neg_should_pass = 0, neg_passed = 0, neg_aligned_flags = 0, neg_vec = 0;
    long long neg_past = 0, neg_stray = 0;
    std::string example[2];
    for (int i = 0; i < NPLANS; i++) {
        const cp_plan *p = PLANS[i].plan;
        for (int vec = 0; vec < 2; vec++) {
            int u = -1;
            for (int k = 0; k < p->nunits && u < 0; k++)
                /* (not a unit with frozen parameters: its packing reads rs_offset, not offset, so
                 * these shifts would leave it equal; its kernels are compared above all the same) */
                if (p->units[k].vec_ok == vec && p->units[k].nparams >= 2 && p->units[k].nfrozen == 0 &&
                    p->params[p->units[k].first_param + 1].offset > 0)
                    u = k;
            if (u < 0) continue;
            for (int field = 0; field < 3; field++) { /* offset, grad_offset, the last one's offset */
                plan_clone &pc = clone_plan(p);
                const cp_unit *U = &p->units[u];
                cp_param &q = pc.params[0][(size_t)(U->first_param + (field == 2 ? U->nparams - 1 : 1))];
                if (field == 0) q.offset -= 1;
                else if (field == 1) q.grad_offset -= 1;
                else q.offset += 1;
                cp_host_world *w = cp_host_world_create(p);
                if (!w) return 2;
                char label[96];
                snprintf(label, sizeof label, " (kernels' %s of %s %s one element)", field == 1 ? "grad_offset" : "offset",
                         q.name, field == 2 ? "moved on" : "moved back");
                check_ctx c = { PLANS[i].name, label, p, &pc.plan, nullptr, w, false };
                for (int rank = 0; rank < p->world_size; rank++) {
                    cp_plan view;
                    cp_plan_view(p, rank, &view);
                    if (view.view_class != 0) continue;
                    for (int oi = 0; oi < view.nops; oi++) {
                        const cp_op_desc *d = &cp_op_descs[view.ops[oi].kind];
                        if (d->action != CP_ACT_COPY || view.ops[oi].unit != u) continue;
                        /* offset: copy-out and packing read it; grad_offset: packing. */
                        bool reads = field != 1 ? d->kernel == CP_KERNEL_COPY_OUT || d->kernel == CP_KERNEL_PACK
                                                : d->kernel == CP_KERNEL_PACK;
                        tally t = {};
                        std::string msg;
                        bool ok = check_op(c, rank, oi, t, &msg);
                        if (reads) {
                            neg_runs++;
                            neg_vec += vec;
                            if (!ok) neg_caught++;
                            else fail("%s%s rank %d op %d %s: the shifted table was NOT caught", c.plan, c.variant, rank, oi,
                                      KNAMES[d->kernel]);
                            if (vec && t.misaligned_pieces + t.misaligned_words > 0) neg_aligned_flags++;
                            if (field == 2) {
                                neg_past++;
                                if (t.stray_ops) neg_stray++;
                                else fail("%s%s rank %d op %d %s: no write outside the output seen", c.plan, c.variant,
                                          rank, oi, KNAMES[d->kernel]);
                            }
                            if (!ok && example[vec].empty()) example[vec] = msg;
                        } else {
                            neg_should_pass++;
                            if (ok) neg_passed++;
                            else fail("%s%s rank %d op %d %s: fails though it does not read the shifted field: %s", c.plan,
                                      c.variant, rank, oi, KNAMES[d->kernel], msg.c_str());
                        }
                    }
                }
                cp_host_world_destroy(w);
            }
        }
    }
    /* On a vector unit a one-element offset shift must also break the
     * alignment (of the copy-out pieces for offset; grad_offset for packing). */
    if (neg_vec && neg_aligned_flags != neg_vec)
        fail("alignment check flagged %lld of %lld shifted vector-unit ops", neg_aligned_flags, neg_vec);
    if (neg_runs == 0) fail("no negative test ran");
    /* tests/ep/plans are in the list: their experts units' own group size must reach the kernels. */
    bool have_ep = false;
    for (int i = 0; i < NPLANS; i++)
        for (int u = 0; u < PLANS[i].plan->nunits; u++)
            if (cp_unit_shard_size(PLANS[i].plan, u) != PLANS[i].plan->shard_size) have_ep = true;
    if (have_ep && all.own_group == 0) fail("no copy op of an experts unit with its own shard group was checked");

    for (int v = 0; v < 2; v++)
        if (!example[v].empty()) printf("negative test, %s unit, caught: %s\n", v ? "vector" : "scalar", example[v].c_str());
    if (conversions) printf("stand-in conversions: %lld checked against runtime/dtype.c\n", conversions);
    printf("kernels host (%s): %d plans, %lld copy ops x ranks checked, %lld mismatched; %lld output bytes, %lld bytes "
           "compared (arena, buffers, guards); %lld vectorised pieces checked for alignment, %lld misaligned%s\n",
           DEVICE_WORDS ? "device loads/stores" : "host loads/stores", NPLANS, all.checks, all.mismatched, all.out_bytes,
           all.bytes_compared, all.pieces, all.misaligned_pieces,
           DEVICE_WORDS ? (", " + std::to_string(all.words) + " device words checked, " +
                           std::to_string(all.misaligned_words) + " misaligned").c_str()
                        : "");
    printf("kernels host: %lld of the copy ops x ranks on experts units sharded over their own group (not the plan's "
           "shard group)\n", all.own_group);
    printf("kernels host: divide factors 3/1.5 and 1.5/7 on every unit (and 3 with %lld units' grads in the all-gather "
           "dtype): %lld pack and view-out ops x ranks, %lld mismatched\n",
           grads_moved, sweep.checks, sweep.mismatched);
    printf("kernels host: one-element shifts: %lld of %lld shifted ops caught (%lld on vector units, %lld of them also "
           "misaligned; %lld moved past the output's end, %lld of them seen writing outside it), %lld of %lld unaffected "
           "ops still equal\n",
           neg_caught, neg_runs, neg_vec, neg_aligned_flags, neg_past, neg_stray, neg_passed, neg_should_pass);
    printf("kernels host: %d failures\n", failures);
    /* tests/run.sh puts this line in its ok line. */
    std::string words = DEVICE_WORDS ? std::to_string(all.words - all.misaligned_words) + " device words aligned, " : "";
    printf("kernels host summary: %d plans, %lld copy ops x ranks (+%lld with other divide factors) equal byte for byte, "
           "%s%lld of %lld one-element shifts caught\n",
           NPLANS, all.checks - all.mismatched, sweep.checks - sweep.mismatched, words.c_str(), neg_caught, neg_runs);
    return failures ? 1 : 0;
}
