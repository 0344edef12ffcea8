"""FSDP x TP and HSDP x TP under the bridge (issue 36, item 2): a model parallelized for tensor
parallelism as torchtitan 0.3 does it, then handed to CommplanFSDP in place of fully_shard.

    plan_from_titan(cfg, name, world, parallel={"dp_shard": 2, "tp": 2}, seq_len=..., out=...)  # make PLAN=
    pd = ParallelDims.from_config(parallelism, world); pd.build_mesh()   # once per mesh and process
    model = titan_tp_model(cfg, parallelism, training, pd)   # parallelize_llama without apply_fsdp_to_decoder
    # (torchtitan's apply_ac goes here, between TP and FSDP, as parallelize_llama applies it)
    copy_full_(model, values, pd.get_mesh("tp"))             # optional: global values -> TP-local pieces
    fsdp = CommplanFSDP(name, model, titan_fsdp_units(model), root=..., library=...)
    # then torchtitan's step unchanged: its SPMD context, loss, clip_grad_norm_, optimizer

Who runs which collective: the library drives the FSDP / HSDP collectives (the plan's all-gathers,
reduce-scatters and all-reduces over dp_shard / dp_replicate: its unit calls); the TP collectives
(the TP styles' redistributions, SP's all-gathers / reduce-scatters, loss_parallel's all-reduces,
and the TP all-reduce of a replicated parameter's partial gradient) run in torch, on torch's
process groups (gloo on CPU), exactly where torchtitan + fully_shard runs them. The plan's own TP
ops (tp_all_gather / tp_reduce_scatter / tp_all_reduce, where its family models them) are never
called through the library: library_calls() groups only the FSDP op kinds (runtime.CALL_KINDS),
and check_plan below checks that no unit call holds a TP op.

How torchtitan 0.3 parallelizes (its default spmd_backend "spmd_types"): Module.parallelize
(torchtitan/protocols/module.py:248, _spmd_distribute_state :296) leaves every parameter a plain
tensor holding this TP rank's local shard (spmd_distribute_tensor, distributed/spmd_types.py:399),
annotated with its SPMD type ({dp: R, tp: V} and a PartitionSpec naming the TP dim for colwise /
rowwise weights and the embeddings; {dp: R, tp: R} for the norms' weights). fully_shard under
resolve_fsdp_mesh's DataParallelMeshDims (distributed/full_dtensor.py:79) then:

* keeps the unsharded parameter it swaps in for forward / backward a plain tensor of the TP-local
  shape and restores its SPMD type on it (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:937
  "keep as plain tensor", _restore_spmd_types :557). The bridge does the same: its unsharded
  parameter (a view of the plan's unsharded buffer, TP-local shape from plan.json) carries the
  SPMD type the model's parameter had (spmd_types' assert_type_like), so torchtitan's TP code
  and its SPMD type checking run on it unchanged;
* turns a replicated parameter's gradient (SPMD type R on tp: its backward type is P, a partial
  sum over tp) into Replicate before the reduce-scatter: _get_grad_inner_tensor
  (_fsdp_param.py:1217) redistributes (Partial, Partial) -> (Partial, Replicate) on the
  (dp_shard, tp) mesh, an all-reduce SUM over tp. The bridge runs the same all-reduce on the
  unit's gradient buffer just before the plan's reduce (before_reduce), in the gradient's dtype;
* makes the sharded parameter a DTensor on the storage mesh (dp_replicate?, dp_shard, tp) with
  placements ([Replicate,] Shard(d) or _StridedShard(d, split_factor=tp) where TP shards the same
  dim d, tp's Shard(k) or Replicate) (_init_sharding_spec_spmd, _fsdp_param.py:591).

The bridge's sharded parameters (what the optimizer sees) stay plain tensors holding exactly that
DTensor's local tensor (this rank's FSDP chunk of its TP-local shard, a view of the plan's sharded
storage), and so do their .grad: the documented equivalent. AdamW runs on them unchanged (the same
element-wise maths); torchtitan's clip_grad_norm_ (torchtitan/distributed/utils.py:599) runs on them
unchanged, since torch.nn.utils.get_total_norm is answered for the bridge's gradients by
commplan.training, which under TP hands torch's own get_total_norm the gradients as fully_shard's
DTensors (dtensor(): the same local tensors, placements and mesh), so the total norm is the global
one over every mesh dimension (a TP-sharded gradient's norm reduced over dp_shard and tp, a
replicated one's over dp_shard only) and bit-identical to fully_shard + TP's. state_dict /
load_state_dict (commplan.checkpoint) give and take those DTensors (2-D or 3-D placements), so DCP
checkpoints move between the bridge and fully_shard + TP both ways.

Checks, each one line naming the first difference: the model is TP-parallelized as the plan says
(every parameter's TP-local shape is plan.json's `shape`, its TP dim plan.json's `tp_dim`, or none
where the plan replicates it; a rank in one of plan.json's tp_classes, a dim not divisible by tp,
against its class's shapes, which it then drives: rank_plan); the storage mesh has the
plan's mesh order; and every family the library's collectives run on (fsdp: dp_shard within a tp
column, dp_replicate, ...) has, for this rank, the same members as that family's axes of the mesh
fully_shard + TP would use (plan.json "mesh", runtime/topology.c).
"""

import torch

from .planfile import PlanError
from .match import PlanMismatch, plan_units

__all__ = ["attach", "check_model", "check_plan", "copy_full_", "local_piece", "rank_plan", "TensorParallel",
           "storage_mesh", "titan_tp_model"]

# the data-parallel and TP axes of torchtitan's dense storage mesh, outer to inner
# (torchtitan/distributed/full_dtensor.py:72 _DENSE_STORAGE_AXES, cp refused below)
_AXES = ("dp_replicate", "dp_shard", "tp")
_TP_OP_KINDS = ("tp_all_gather", "tp_reduce_scatter", "tp_all_reduce")


def _tp(plan):
    return plan.get("parallel", {}).get("tp", 1)


def check_plan(plan):
    """Refuses, in one line naming the plan field, what the bridge cannot drive under TP."""
    name = plan.get("plan", "?")
    par = plan.get("parallel", {})
    for ax in ("cp", "pp", "ep"):
        if par.get(ax, 1) != 1:
            raise PlanError("plan %s: parallel.%s = %d with tp = %d: the bridge drives dp_replicate x dp_shard x tp "
                            "(FSDP / HSDP x TP); set parallel.%s = 1" % (name, ax, par[ax], _tp(plan), ax))
    from .runtime import CALL_KINDS
    kinds = {k for ks in CALL_KINDS.values() for k in ks}
    bad = [k for k in _TP_OP_KINDS if k in kinds]
    if bad:  # the TP collectives are torch's: no unit call may issue one
        raise PlanError("commplan: runtime.CALL_KINDS holds the TP op %s; TP collectives run in torch" % bad[0])


# what a TP class (plan.json tp_classes: TP ranks whose TP-local shapes differ from TP rank 0's,
# a dim not divisible by tp) sets for its ranks; the rest (name, dtype, shard_dim, tp_dim,
# full_shape) is every rank's
_CLASS_UNIT_KEYS = ("slot_numel", "grads_numel", "vec_ok")
_CLASS_PARAM_KEYS = ("shape", "numel", "chunk", "padded_numel", "offset", "outer", "run", "grad_offset")


def _my_rank():
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    import os
    return int(os.environ.get("RANK", "0"))


def rank_plan(plan, rank=None):
    """plan.json as this rank's TP class holds it: where tp_classes lists the rank's TP
    coordinate (plan.json mesh), every unit's and parameter's per-class fields (TP-local shape,
    numel, FSDP chunk, padding, offsets) replaced by the class's; plan itself where the rank is in
    class 0. The library's tables hold the same per class (runtime/commplan.h, TP classes)."""
    rank = _my_rank() if rank is None else rank
    mesh = plan["mesh"]
    i = mesh["names"].index("tp")
    t = (rank // mesh["strides"][i]) % mesh["sizes"][i]
    cls = next((c for c in plan.get("tp_classes") or [] if t in c["tp_ranks"]), None)
    if cls is None:
        return plan
    by_unit = {u["name"]: u for u in cls["units"]}
    units = []
    for u in plan["units"]:
        cu = by_unit[u["name"]]
        cps = {q["name"]: q for q in cu["params"]}
        params = [dict(q, **{k: cps[q["name"]][k] for k in _CLASS_PARAM_KEYS if k in cps[q["name"]]})
                  for q in u["params"]]
        units.append(dict(u, params=params, **{k: cu[k] for k in _CLASS_UNIT_KEYS if k in cu}))
    return dict(plan, units=units)


def _tp_axis(plan):
    """spmd_types' MeshAxis of the plan's tp dim (size, stride from plan.json's mesh)."""
    import spmd_types as spmd
    mesh = plan["mesh"]
    i = mesh["names"].index("tp")
    return spmd.MeshAxis.of(mesh["sizes"][i], mesh["strides"][i])


def _model_tp_dim(p, axis):
    """(TP-local shape, TP dim or None, SPMD type on tp) of a model parameter after torchtitan's
    Module.parallelize under spmd_types; None when it carries no SPMD type."""
    from spmd_types.runtime import get_local_type, get_partition_spec, has_local_type
    if not has_local_type(p):
        return None
    t = get_local_type(p).get(axis)
    dim = None
    spec = get_partition_spec(p)
    if spec is not None:
        for d, entry in enumerate(spec):
            axes = entry if isinstance(entry, tuple) else (entry,)
            if axis in axes:
                dim = d
    return list(p.shape), dim, t


def check_model(plan, wrapped):
    """The model (its parameters as torchtitan's TP left them, before the bridge takes them)
    against plan.json under TP: one line on the first difference. wrapped: units_from_module's
    [(unit, [(fqn, param)])], the root last. Returns the plan as this rank's TP class holds it
    (rank_plan), which the bridge then drives."""
    check_plan(plan)
    plan = rank_plan(plan)
    from torch.distributed.tensor import DTensor
    name = plan.get("plan", "?")
    axis = _tp_axis(plan)
    order = [wrapped[-1]] + wrapped[:-1]
    for (_, params), pu in zip(order, plan_units(plan)):
        for (fqn, p), meta in zip(params, pu["params"]):
            if isinstance(p, DTensor):
                raise PlanMismatch("plan %s: parameter %s is a DTensor (%s): the bridge takes the model as torchtitan "
                                   "0.3's spmd_types backend parallelizes it (plain TP-local tensors, "
                                   "protocols/module.py:296); set parallelism.spmd_backend = \"spmd_types\""
                                   % (name, fqn, p.placements))
            got = _model_tp_dim(p, axis)
            if got is None:
                raise PlanMismatch("plan %s shards %s over tp = %d, but the model's parameter carries no TP layout: "
                                   "parallelize it for TP first (torchtitan: model.parallelize(parallel_dims), "
                                   "models/llama3/parallelize.py:44), then hand it to CommplanFSDP in place of "
                                   "fully_shard" % (name, fqn, _tp(plan)))
            shape, dim, t = got
            want = meta.get("tp_dim")
            if shape != list(meta["shape"]) or dim != want:
                raise PlanMismatch("plan %s: parameter %s: the model holds TP-local shape %s sharded on TP dim %s "
                                   "(SPMD type %r on tp), plan.json's units[%s].params has shape %s, tp_dim %s: "
                                   "regenerate the plan from the model at this tp (plan_from_titan(..., "
                                   "parallel={..., \"tp\": %d}))" % (name, fqn, shape, dim, t, pu["name"],
                                                                     list(meta["shape"]), want, _tp(plan)))
    return plan


def storage_mesh(plan, device, mesh=None):
    """The mesh fully_shard + TP puts its DTensors on (torchtitan's dense storage mesh,
    full_dtensor.py:92 resolve_fsdp_mesh): (dp_replicate,) dp_shard, tp, dp_shard kept at size 1,
    made with init_device_mesh (a collective) unless given; checked against plan.json's mesh
    (names, sizes, strides)."""
    par = plan["parallel"]
    names = [a for a in _AXES if a == "dp_shard" or par.get(a, 1) > 1]
    sizes = [par.get(a, 1) for a in names]
    stride, strides = 1, {}
    for n, s in reversed(list(zip(names, sizes))):
        strides[n] = stride
        stride *= s
    pm = plan["mesh"]
    for n, s, st in zip(pm["names"], pm["sizes"], pm["strides"]):
        if n not in strides or s != par.get(n) or strides[n] != st:
            raise PlanError("plan %s: mesh dim %s (size %d, stride %d) is not where fully_shard + TP's mesh %s has it "
                            "(torchtitan's dense storage mesh, full_dtensor.py:72: dp_replicate, dp_shard, tp outer "
                            "to inner)" % (plan.get("plan", "?"), n, s, st, dict(zip(names, sizes))))
    if mesh is None:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device, tuple(sizes), mesh_dim_names=tuple(names))
    return _check_mesh(plan, mesh, names, sizes)


def _check_mesh(plan, mesh, names, sizes):
    if tuple(mesh.mesh_dim_names or ()) != tuple(names) or tuple(mesh.shape) != tuple(sizes):
        raise PlanError("plan %s: the mesh given is %s %s; fully_shard + TP's storage mesh is %s %s"
                        % (plan.get("plan", "?"), mesh.mesh_dim_names, tuple(mesh.shape), tuple(names), tuple(sizes)))
    return mesh


def _family_members(mesh, axes):
    """This rank's instance of a family (the mesh axes it spans) as sorted global ranks."""
    import torch.distributed as dist
    ranks = mesh.mesh
    me = dist.get_rank()
    coord = [int(c[0]) for c in (ranks == me).nonzero(as_tuple=True)]
    idx = []
    for d, n in enumerate(mesh.mesh_dim_names):
        idx.append(slice(None) if n in axes else coord[d])
    return sorted(int(r) for r in ranks[tuple(idx)].reshape(-1).tolist())


class TensorParallel:
    """The bridge's TP side for one CommplanFSDP (fsdp._tp)."""

    def __init__(self, fsdp, wrapped, mesh=None):
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.placement_types import _StridedShard
        self.f = fsdp
        plan = fsdp.plan
        self.tp = _tp(plan)
        dev = fsdp.params[0].sharded.device.type if fsdp.params else "cpu"
        self.mesh = storage_mesh(plan, dev, mesh)
        self._check_groups()
        names = list(self.mesh.mesh_dim_names)
        self.tp_group = self.mesh.get_group("tp")
        # every parameter's fully_shard + TP sharded spec, and whether its gradient is a partial
        # sum over tp (SPMD type R on tp: backward type P)
        axis = _tp_axis(plan)
        order = [wrapped[-1]] + wrapped[:-1]
        origs = [p for (_, params) in order for _, p in params]
        metas = [m for u in plan_units(plan) for m in u["params"]]
        self.spec = {}
        self.partial_grad = set()
        from spmd_types.runtime import assert_type_like
        import spmd_types as spmd
        for P, meta, orig in zip(fsdp.params, metas, origs):
            k, td = meta.get("shard_dim", 0), meta.get("tp_dim")
            pl = []
            for n in names:
                if n == "dp_replicate":
                    pl.append(Replicate())
                elif n == "dp_shard":
                    pl.append(_StridedShard(k, split_factor=self.tp) if td == k else Shard(k))
                else:
                    pl.append(Replicate() if td is None else Shard(td))
            self.spec[P.index] = (tuple(pl), torch.Size(meta.get("full_shape", meta["shape"])))
            t = _model_tp_dim(orig, axis)[2]
            if t == spmd.R:
                self.partial_grad.add(P.index)
            assert_type_like(P.unsharded, orig)  # the SPMD type the model's parameter had

    def _check_groups(self):
        """Every family the plan's collectives run on: this rank's members in the library (its
        topology: runtime/topology.c through cp_hostlib_group_member; the GPU library's, plan.json's
        mesh) equal the same axes' group of the storage mesh."""
        from . import training
        plan = self.f.plan
        lib = self.f.lib
        used = {op["group"] for op in plan["ops"] if op.get("group")}
        for fam in plan["groups"]:
            if fam["name"] not in used or fam["size"] < 2:
                continue
            want = _family_members(self.mesh, fam["axes"])
            groups = getattr(lib, "_groups", None)
            if groups is not None:
                mine = [c for (fi, c) in groups if fi == fam["id"]]
                got = sorted(lib.group_members(fam["id"], mine[0])) if mine else None
            else:
                got = next((g for g in training._members_by_mesh(plan, fam) if self.f.lib.rank in g), None)
            if got != want:
                raise PlanError("plan %s: family %s (axes %s) holds ranks %s for this rank in the library, but %s on "
                                "fully_shard + TP's mesh %s: the plan's mesh (plan.json \"mesh\") must order the axes "
                                "as the storage mesh does" % (self.f.name, fam["name"], fam["axes"], got, want,
                                                              self.mesh.mesh_dim_names))

    def check_mesh(self, mesh):
        """A mesh given for the DTensors (commplan.checkpoint's mesh=): the storage mesh's shape."""
        return _check_mesh(self.f.plan, mesh, list(self.mesh.mesh_dim_names), list(self.mesh.shape))

    # -- the step --

    def before_reduce(self, params):
        """A replicated parameter's gradient is a partial sum over tp: all-reduced (SUM) over tp
        before the plan reduces it over dp, as fully_shard's _get_grad_inner_tensor redistributes
        Partial -> Replicate on the tp dim (_fsdp_param.py:1245)."""
        import torch.distributed as dist
        for P in params:
            if P.index in self.partial_grad:
                dist.all_reduce(P.grad_buf, op=dist.ReduceOp.SUM, group=self.tp_group)

    def type_like_unsharded(self, t, P):
        """An evaluation forward's gathered temporary of P (commplan.training.EvalForward) typed as
        the training path's unsharded parameter: its SPMD type and PartitionSpec."""
        from spmd_types.runtime import assert_type_like
        assert_type_like(t, P.unsharded)

    # -- DTensor views --

    def dtensor(self, P, local):
        """local (this rank's sharded tensor of P: its parameter, gradient or optimizer state) as
        fully_shard + TP's DTensor."""
        from torch.distributed.tensor import DTensor
        placements, shape = self.spec[P.index]
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(local, self.mesh, placements, run_check=False, shape=shape, stride=stride)

    def specs(self):
        """commplan.checkpoint's {id(sharded parameter): (P, placements, global shape)}."""
        return {id(P.sharded): (P,) + self.spec[P.index] for P in self.f.params}

    def total_norm(self, grads, norm_type, error_if_nonfinite, foreach, orig):
        """torch's get_total_norm (orig: the unwrapped one) on the gradients as fully_shard + TP's
        DTensors: the global norm over every mesh dim, returned as a plain 0-dim tensor."""
        from torch.distributed.tensor import DTensor
        by_grad = {id(P.sharded.grad): P for P in self.f.params if P.sharded.grad is not None}
        dts = [self.dtensor(by_grad[id(g)], g) for g in grads]
        total = orig(dts, norm_type, error_if_nonfinite, foreach)
        return total.full_tensor() if isinstance(total, DTensor) else total


def local_piece(full, mesh, placements):
    """This rank's local tensor of the global tensor `full` under fully_shard + TP's placements on
    the storage mesh: the innermost dim (tp) first, then dp_shard on the TP-local piece (what
    _StridedShard(d, split_factor=tp) on dp_shard with Shard(d) on tp means:
    torch/distributed/fsdp/_fully_shard/_fsdp_param.py:640), each as torch.chunk cuts (uneven
    shards included, which distribute_tensor refuses for _StridedShard: placement_types.py:1015)."""
    t = full
    for d in reversed(range(mesh.ndim)):
        p = placements[d]
        if hasattr(p, "dim"):
            chunks = torch.chunk(t, mesh.size(d), dim=p.dim)
            r = mesh.get_local_rank(d)
            t = chunks[r] if r < len(chunks) else t.narrow(p.dim, 0, 0)
    return t


def copy_full_(model, values, tp_mesh):
    """Sets a TP-parallelized model's parameters (plain TP-local tensors, torchtitan's spmd_types
    layout) from global tensors {FQN: tensor}: each its TP piece on its TP dim (its PartitionSpec)
    at this rank's tp coordinate, as spmd_distribute_tensor cuts it (torch.chunk)."""
    import spmd_types as spmd
    axis = spmd.MeshAxis.of(tp_mesh.get_group())
    r = tp_mesh.get_local_rank()
    with torch.no_grad():
        for n, p in model.named_parameters():
            got = _model_tp_dim(p, axis)
            d = got[1] if got is not None else None
            p.copy_(values[n] if d is None else torch.chunk(values[n], tp_mesh.size(), dim=d)[r])


def attach(fsdp, wrapped, mesh=None):
    """CommplanFSDP's TP side (None for a plan without TP), after its parameters are built."""
    if _tp(fsdp.plan) == 1:
        return None
    return TensorParallel(fsdp, wrapped, mesh)


def titan_tp_model(cfg, parallelism, training, parallel_dims):
    """torchtitan's model for a config, parallelized as parallelize_llama does it (update_from_config,
    build, validate_config, model.parallelize: models/llama3/parallelize.py:42-44) but without its
    apply_fsdp_to_decoder: what CommplanFSDP takes in place of fully_shard (titan_fsdp_units(model)
    gives the units). Returns the model."""
    from torchtitan.distributed.full_dtensor import validate_config
    from torchtitan.models.llama3 import model_registry
    from torchtitan.trainer import Trainer
    spec = model_registry("debugmodel")
    spec.model = cfg
    cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training))
    model = cfg.build()
    if parallelism.spmd_backend in ("full_dtensor", "spmd_types"):
        validate_config(parallel_dims, model)
    model.parallelize(parallel_dims)
    return model
