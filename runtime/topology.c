/* Rank geometry from the mesh: coordinates (row-major, last dim fastest),
 * group color/key per family, and per-rank shard lengths. Closed forms, so
 * the tables never hold per-rank data. */
#include "commplan.h"

void cp_rank_coords_of(const cp_plan *p, int rank, cp_rank_coords *out)
{
    out->rank = rank;
    int r = rank;
    for (int d = p->mesh_ndim - 1; d >= 0; d--) {
        out->coords[d] = r % p->mesh_sizes[d];
        r /= p->mesh_sizes[d];
    }
}

void cp_group_of(const cp_plan *p, int family, int rank, int *color, int *key)
{
    cp_rank_coords c;
    cp_rank_coords_of(p, rank, &c);
    uint32_t mask = p->families[family].axis_mask;
    int col = 0, k = 0, n = 1;
    for (int d = 0; d < p->mesh_ndim; d++) {
        if (mask & (1u << d)) k = k * p->mesh_sizes[d] + c.coords[d], n *= p->mesh_sizes[d];
        else col = col * p->mesh_sizes[d] + c.coords[d];
    }
    int inner = p->families[family].inner;
    if (inner > 0) { /* a part family: groups of inner consecutive keys */
        col = col * (n / inner) + k / inner;
        k %= inner;
    }
    *color = col;
    *key = k;
}

int cp_group_member(const cp_plan *p, int family, int color, int key)
{
    uint32_t mask = p->families[family].axis_mask;
    int inner = p->families[family].inner;
    if (inner > 0) { /* a part family: back to the masked axes' color and key */
        int n = 1;
        for (int d = 0; d < p->mesh_ndim; d++)
            if (mask & (1u << d)) n *= p->mesh_sizes[d];
        key = (color % (n / inner)) * inner + key;
        color /= n / inner;
    }
    int coords[CP_MAX_MESH_DIMS];
    for (int d = p->mesh_ndim - 1; d >= 0; d--) {
        if (mask & (1u << d)) { coords[d] = key % p->mesh_sizes[d]; key /= p->mesh_sizes[d]; }
        else { coords[d] = color % p->mesh_sizes[d]; color /= p->mesh_sizes[d]; }
    }
    int rank = 0;
    for (int d = 0; d < p->mesh_ndim; d++) rank = rank * p->mesh_sizes[d] + coords[d];
    return rank;
}

int cp_shard_rank(const cp_plan *p, int rank)
{
    if (p->shard_family < 0) return 0;
    int color, key;
    cp_group_of(p, p->shard_family, rank, &color, &key);
    return key;
}

int cp_tp_rank(const cp_plan *p, int rank)
{
    if (p->tp_size <= 1 || p->tp_mesh_dim == -1) return 0;
    cp_rank_coords c;
    cp_rank_coords_of(p, rank, &c);
    if (p->tp_mesh_dim >= 0) return c.coords[p->tp_mesh_dim];
    /* tp over the consecutive axes from -2 - tp_mesh_dim whose sizes make
     * tp_size (an expert mesh whose ep groups split TP's: gen/emit.lua) */
    int t = 0, n = 1;
    for (int d = -2 - p->tp_mesh_dim; d < p->mesh_ndim && n < p->tp_size; d++) {
        t = t * p->mesh_sizes[d] + c.coords[d];
        n *= p->mesh_sizes[d];
    }
    return t;
}

int cp_op_group_key(const cp_plan *p, const cp_op *op, int rank)
{
    if (op->family < 0) return 0;
    int color, key;
    cp_group_of(p, op->family, rank, &color, &key);
    return key;
}

int cp_op_group_size(const cp_plan *p, const cp_op *op)
{
    return op->family < 0 ? 1 : p->families[op->family].size;
}

int cp_pp_rank(const cp_plan *p, int rank)
{
    if (p->pp_size <= 1 || p->pp_mesh_dim < 0) return 0;
    cp_rank_coords c;
    cp_rank_coords_of(p, rank, &c);
    return c.coords[p->pp_mesh_dim];
}

int cp_pp_peer_rank(const cp_plan *p, int rank, int peer_coord)
{
    if (p->pp_size <= 1 || p->pp_mesh_dim < 0) return rank;
    /* Row-major, last dim fastest: the pp dim's stride is the product of the dims after it. */
    int stride = 1;
    for (int d = p->mesh_ndim - 1; d > p->pp_mesh_dim; d--) stride *= p->mesh_sizes[d];
    return rank + (peer_coord - cp_pp_rank(p, rank)) * stride;
}

void cp_plan_view(const cp_plan *p, int rank, cp_plan *out)
{
    *out = *p;
    out->view_class = 0;
    if (p->nclasses <= 0 || !p->classes) return;
    int tp = p->tp_size > 0 ? p->tp_size : 1;
    int c = p->class_of ? p->class_of[cp_pp_rank(p, rank) * tp + cp_tp_rank(p, rank)] : 0;
    const cp_class *k = &p->classes[c];
    /* Tables written before a class had its own counts (all zero) share the plan's. */
    if (k->nunits > 0 || k->nparams > 0 || k->nops > 0) {
        out->nunits = k->nunits;
        out->nparams = k->nparams;
        out->nops = k->nops;
    }
    out->units = k->units;
    out->params = k->params;
    out->ops = k->ops;
    out->waits = k->waits;
    out->nwaits = k->nwaits;
    out->nevents = k->nevents;
    out->arena_bytes = k->arena_bytes;
    out->symm_bytes = k->symm_bytes;
    out->view_class = c;
}

int cp_replicate_rank(const cp_plan *p, int rank)
{
    if (p->replicate_family < 0) return 0;
    int color, key;
    cp_group_of(p, p->replicate_family, rank, &color, &key);
    return key;
}

int64_t cp_param_valid(const cp_param *prm, int shard_rank)
{
    if (prm->shard_dim > 0) return prm->padded;
    int64_t v = prm->numel - (int64_t)shard_rank * prm->run;
    return v < 0 ? 0 : (v > prm->run ? prm->run : v);
}

int64_t cp_param_global_index(const cp_param *prm, int W, int shard_rank, int64_t j)
{
    int64_t o = j / prm->run, t = j % prm->run;
    return o * (int64_t)W * prm->run + (int64_t)shard_rank * prm->run + t;
}

/* The local tensor is (outer, rows, inner) around tp_dim; the full one
 * (outer, tp_full, inner), and TP rank t's rows start at t * tp_chunk. */
int64_t cp_param_full_index(const cp_param *prm, int tp_rank, int64_t i)
{
    if (!prm->tp_sharded) return i;
    int64_t inner = 1;
    for (int d = prm->tp_dim + 1; d < prm->ndim; d++) inner *= prm->shape[d];
    int64_t rows = prm->shape[prm->tp_dim];
    int64_t o = i / (rows * inner), rem = i % (rows * inner);
    return (o * prm->tp_full + (int64_t)tp_rank * prm->tp_chunk + rem / inner) * inner + rem % inner;
}

int64_t cp_param_full_numel(const cp_param *prm)
{
    return prm->full_numel > 0 ? prm->full_numel : prm->numel;
}

int cp_unit_shard_size(const cp_plan *p, int unit)
{
    const cp_unit *U = &p->units[unit];
    return U->expert ? U->shard_size : p->shard_size;
}

int cp_unit_shard_family(const cp_plan *p, int unit)
{
    const cp_unit *U = &p->units[unit];
    return U->expert ? U->shard_family : p->shard_family;
}

int cp_unit_shard_rank(const cp_plan *p, int unit, int rank)
{
    int f = cp_unit_shard_family(p, unit);
    if (f < 0) return 0;
    int color, key;
    cp_group_of(p, f, rank, &color, &key);
    return key;
}

int cp_unit_split_rank(const cp_plan *p, int unit, int rank)
{
    const cp_unit *U = &p->units[unit];
    if (!U->expert) return cp_tp_rank(p, rank);
    int color, key;
    cp_group_of(p, U->split_family, rank, &color, &key);
    return key;
}

int cp_part_check(const cp_plan *p, int unit, int first, int count)
{
    if (unit < 0 || unit >= p->nunits) return -1;
    if (count == 0) return first == 0 ? 0 : -1;
    return first >= 0 && count >= 1 && first <= p->units[unit].nparams - count ? 0 : -1;
}

int64_t cp_part_total(const cp_plan *p, int unit, int first, int count)
{
    const cp_unit *U = &p->units[unit];
    if (count <= 0) return cp_unit_rs_total(U);
    int64_t total = 0;
    for (int j = first; j < first + count; j++)
        if (!p->params[U->first_param + j].frozen) total += p->params[U->first_param + j].padded;
    return total;
}

int64_t cp_part_offset(const cp_plan *p, int unit, int first, int count)
{
    const cp_unit *U = &p->units[unit];
    if (count <= 0) return 0;
    return cp_param_rs_offset(U, &p->params[U->first_param + first]);
}

void cp_post_forward_piece(const cp_plan *p, int unit, int shard_rank, int copy_out, int i, int64_t *in_off,
                           int64_t *out_off, int64_t *bytes)
{
    const cp_unit *U = &p->units[unit];
    int64_t W = cp_unit_shard_size(p, unit), sc = W / U->post_forward;
    int j = i % U->nparams;
    /* the member whose slice it is: the copy's own (its key in its
     * post-forward group), the copy-out's i / nparams */
    int64_t m = copy_out ? i / U->nparams : shard_rank % U->post_forward;
    const cp_param *prm = &p->params[U->first_param + j];
    int64_t len = sc * prm->padded * (int64_t)cp_dtype_size(cp_param_ag_dtype(U, prm));
    int64_t unsharded = cp_param_unsharded_offset(U, prm, W) + m * len; /* shards m*sc .. (m+1)*sc - 1 */
    int64_t slot = sc * cp_param_ag_offset(U, prm); /* in a member's post-forward slot */
    if (copy_out) {
        *in_off = m * sc * cp_unit_ag_bytes(U) + slot;
        *out_off = unsharded;
    } else {
        *in_off = unsharded;
        *out_off = slot;
    }
    *bytes = len;
}
