/* The generator's per-rank buffer arena, seen from the runtime: buffer
 * sizes and the order check for library-driven unshards. */
#include "commplan.h"

int64_t cp_arena_buffer_bytes(const cp_plan *p, int unit, cp_buffer k)
{
    const cp_unit *U = &p->units[unit];
    int64_t W = p->shard_size;
    switch (k) {
    case CP_BUF_SHARDED:
    case CP_BUF_SHARDED_GRADS: return U->total * (int64_t)cp_dtype_size(U->orig_dtype);
    case CP_BUF_AG:
    case CP_BUF_UNSHARDED: return W * U->total * (int64_t)cp_dtype_size(U->ag_dtype);
    case CP_BUF_GRADS: return U->grads_numel * (int64_t)cp_dtype_size(U->grad_dtype);
    case CP_BUF_RS_IN: return W * U->total * (int64_t)cp_dtype_size(U->reduce_dtype);
    case CP_BUF_ACT: return U->act_numel * (int64_t)cp_dtype_size(U->ag_dtype);
    case CP_BUF_PARTIAL: return U->partial_numel * (int64_t)cp_dtype_size(U->reduce_dtype);
    default: return U->total * (int64_t)cp_dtype_size(U->reduce_dtype);
    }
}

static int overlap(const cp_plan *p, int u, cp_arena_buffer ku, int v, cp_arena_buffer kv)
{
    int64_t a = p->units[u].arena_offset[ku], na = cp_arena_buffer_bytes(p, u, ku);
    int64_t b = p->units[v].arena_offset[kv], nb = cp_arena_buffer_bytes(p, v, kv);
    return na > 0 && nb > 0 && a < b + nb && b < a + na;
}

int cp_unshard_conflict(const cp_plan *p, int unit, const unsigned char *live)
{
    for (int v = 0; v < p->nunits; v++)
        if (v != unit && live[v] &&
            (overlap(p, unit, CP_BUF_AG, v, CP_BUF_UNSHARDED) || overlap(p, unit, CP_BUF_UNSHARDED, v, CP_BUF_UNSHARDED)))
            return v;
    return -1;
}
