"""What a training loop asks of the bridge besides forward and backward (issue 36): gradient
clipping by the global norm and evaluation forwards under no_grad.

Clipping (torchtitan/distributed/utils.py:599 clip_grad_norm_): under fully_shard the gradients
are DTensors; torch.nn.utils.get_total_norm's per-gradient norms come out with _NormPartial
placement, and the vector_norm of their stack redistributes them to Replicate first (each
element: x ** p, all-reduce SUM over the mesh, x ** (1/p); MAX for the inf norm:
torch/distributed/tensor/_ops/_math_ops.py:63), then takes the norm of the reduced stack. The
bridge's sharded gradients are plain tensors holding this rank's shard, so the same steps run
here by hand, on the same local shards, with torch's grouping and _foreach_norm: the
reduction over the plan's shard group -- the family of its all_gather ops (fsdp: dp_shard,
times cp where the plan has it), never dp_replicate, whose members hold the same shard (HSDP's
Replicate placement) -- then torch.nn.utils.clip_grads_with_norm_ (clip_coef = max_norm /
(total + 1e-6), clamped to 1.0). The norm and the clipped gradients are bit-identical to
fully_shard's (tests/python/test_bridge_train.py). Under tensor parallelism the gradients go to
torch's own get_total_norm as fully_shard + TP's DTensors (commplan.tensor_parallel): the norm
over dp_shard and tp for TP-sharded gradients, over dp_shard alone for TP-replicated ones
(tests/python/test_bridge_tp.py).

The reduction runs on the group the bridge's collectives use: HostLibrary's process group of
that family (the one its gloo all-gathers run on); on the GPU library, whose NCCL communicators
are its own, a torch.distributed group of the same members (made once, collectively, from
plan.json's mesh), which needs torch.distributed initialized.

A plain torch.nn.utils.clip_grad_norm_ (or get_total_norm, as torchtitan calls it) on the
bridge's parameters is made right, not refused: while a CommplanFSDP is open, torch's
get_total_norm is wrapped so that gradients which are a bridge's sharded gradients get the
global norm above; a list mixing them with other gradients is refused with one line (their
norms would be summed over the shard group as if sharded). Other gradients are untouched.

Evaluation: a forward under torch.no_grad() / torch.inference_mode() gathers each unit's
parameters into temporary tensors (one all_gather_into_tensor of the unit's padded shards on
the same group, cast to the unit's param_dtype, as FSDP2's unshard) and drops them after the
unit's forward, without any library call: the plan's calls, buffers and order are untouched,
so the next training micro-step runs as if no evaluation had happened (and its order check
still refuses an order the plan does not cover). Under TP the temporaries carry the training
path's SPMD types, and under ChunkedLossWrapper the loss head is held across the chunks
(EvalForward; tests/python/test_bridge_tp.py, test_bridge_ac.py).
"""

import math
import weakref

import torch
import torch.nn as nn

from .planfile import PlanError

__all__ = ["clip_grad_norm_", "total_norm", "shard_group", "EvalForward"]

_LIVE = weakref.WeakSet()  # open CommplanFSDP objects (their sharded gradients get the global norm)
_ORIG = {}  # torch's own get_total_norm, while wrapped


# ---- the plan's shard group ----------------------------------------------------------------

def _shard_family(plan):
    fams = sorted({op["group"] for op in plan["ops"] if op["kind"] == "all_gather" and op.get("group")})
    if not fams and plan["world_size"] == 1:
        return {"name": "world", "id": -1, "size": 1}  # one rank: nothing sharded, nothing to reduce
    if len(fams) != 1:
        raise PlanError("plan %s: its all_gather ops run on %s; the bridge's norm and evaluation gather need exactly "
                        "one shard group" % (plan.get("plan", "?"), fams or "no group"))
    return next(f for f in plan["groups"] if f["name"] == fams[0])


def _members_by_mesh(plan, fam):
    """Every instance of family fam as sorted global ranks, from plan.json's mesh (names, sizes,
    strides): ranks sharing their coordinates on the axes outside the family."""
    mesh = plan["mesh"]
    others = [(s, st) for n, s, st in zip(mesh["names"], mesh["sizes"], mesh["strides"]) if n not in fam["axes"]]
    groups = {}
    for r in range(plan["world_size"]):
        groups.setdefault(tuple((r // st) % s for s, st in others), []).append(r)
    return sorted(groups.values())


def shard_group(fsdp):
    """(process group or None, size) of this rank's instance of the plan's shard group. None
    where the group has one member (nothing to reduce)."""
    cached = getattr(fsdp, "_shard_group", None)
    if cached is not None:
        return cached
    fam = _shard_family(fsdp.plan)
    lib = fsdp.lib
    pg = None
    if fam["size"] > 1:
        groups = getattr(lib, "_groups", None)
        if groups is not None:  # HostLibrary: the process groups its collectives run on
            mine = [g for (fi, _), g in groups.items() if fi == fam["id"]]
            if len(mine) != 1:
                raise PlanError("plan %s: the host library has %d process groups of family %s for this rank"
                                % (fsdp.name, len(mine), fam["name"]))
            pg = mine[0]
        else:
            import torch.distributed as dist
            if not dist.is_available() or not dist.is_initialized():
                raise PlanError("plan %s: clipping by the global norm and evaluation forwards reduce over its %s "
                                "group, which the GPU library's own NCCL communicators do not expose; call "
                                "torch.distributed.init_process_group(\"nccl\") before CommplanFSDP"
                                % (fsdp.name, fam["name"]))
            me = dist.get_rank()
            for ranks in _members_by_mesh(fsdp.plan, fam):  # collective: every rank, same order
                g = dist.new_group(ranks)
                if me in ranks:
                    pg = g
    fsdp._shard_group = (pg, fam["size"])
    return fsdp._shard_group


# ---- the global norm -----------------------------------------------------------------------

def _local_norms(grads, norm_type, foreach):
    """Each tensor's norm, grouped and computed as torch.nn.utils.get_total_norm computes them
    (torch/nn/utils/clip_grad.py:49 _get_total_norm: by device and dtype, _foreach_norm where
    supported), in its order. The inf norm of an empty tensor, which _foreach_norm refuses (no
    identity for max; FSDP2 raises on a rank whose shard is empty and leaves the others
    waiting), is 0 here: every norm is >= 0 and the max is exact whatever computes it."""
    from torch.utils._foreach_utils import _device_has_foreach_support, _group_tensors_by_device_and_dtype, \
        _has_foreach_support
    if math.isinf(norm_type):
        return [torch.linalg.vector_norm(g, norm_type) if g.numel() else g.new_zeros(()) for g in grads]
    norms = []
    for (device, _), ([ts], _) in _group_tensors_by_device_and_dtype([grads]).items():
        if (foreach is None and _has_foreach_support(ts, device)) or (foreach and _device_has_foreach_support(device)):
            norms.extend(torch._foreach_norm(ts, norm_type))
        elif foreach:
            raise RuntimeError("foreach=True was passed, but can't use the foreach API on %s tensors" % device.type)
        else:
            norms.extend(torch.linalg.vector_norm(g, norm_type) for g in ts)
    return norms


def total_norm(fsdp, grads, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm over the whole mesh of `grads` (this rank's sharded gradients, the same
    parameters on every rank), as fully_shard's DTensor gradients give it: each gradient's norm
    is a DTensor with _NormPartial placement, torch.stack keeps it, and vector_norm of a partial
    input redistributes it to Replicate first (the stack reduced element-wise: x ** p, all-reduce
    SUM, x ** (1/p), torch/distributed/tensor/_ops/_math_ops.py:63; MAX for the inf norm), then
    takes the norm of the reduced stack on every rank."""
    import torch.distributed as dist
    norm_type = float(norm_type)
    grads = list(grads)
    if not grads:
        return torch.tensor(0.0)
    if getattr(fsdp, "_tp", None) is not None:  # under TP: torch's own on fully_shard + TP's DTensors
        return fsdp._tp.total_norm(grads, norm_type, error_if_nonfinite, foreach,
                                   _ORIG.get("get_total_norm", torch.nn.utils.get_total_norm))
    norms = _local_norms(grads, norm_type, foreach)
    first = grads[0].device
    stack = torch.stack([n.to(first) for n in norms])
    pg, _ = shard_group(fsdp)
    if pg is not None:
        if math.isinf(norm_type):  # Partial("max") / ("min"): no power
            dist.all_reduce(stack, op=dist.ReduceOp.MAX if norm_type > 0 else dist.ReduceOp.MIN, group=pg)
        elif norm_type == 0:  # a count of nonzeros: summed
            dist.all_reduce(stack, op=dist.ReduceOp.SUM, group=pg)
        else:
            stack = stack ** norm_type
            dist.all_reduce(stack, op=dist.ReduceOp.SUM, group=pg)
            stack = stack ** (1.0 / norm_type)
    total = torch.linalg.vector_norm(stack, norm_type)
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError("The total norm of order %s for gradients from `parameters` is non-finite, so it cannot "
                           "be clipped. To disable this error and scale the gradients by the non-finite norm anyway, "
                           "set `error_if_nonfinite=False`" % norm_type)
    return total


def _owner(grads):
    """The open CommplanFSDP whose sharded gradients these are, None when none is; a mix is refused."""
    ids = {id(g) for g in grads}
    owner, foreign = None, 0
    for f in list(_LIVE):
        mine = {id(P.sharded.grad) for P in f.params if P.sharded.grad is not None}
        hit = ids & mine
        if hit:
            if owner is not None:
                raise PlanError("clip_grad_norm_: the gradients belong to two CommplanFSDP models (%s, %s); clip "
                                "each model's parameters on their own" % (owner.name, f.name))
            owner, foreign = f, len(ids - mine)
    if owner is not None and foreign:
        raise PlanError("clip_grad_norm_: %d of the gradients are not plan %s's sharded gradients; their norm would be "
                        "reduced over the plan's shard group as if sharded: clip the bridge's parameters "
                        "(fsdp.model.parameters()) apart from the others" % (foreign, owner.name))
    return owner


def _get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """torch.nn.utils.get_total_norm, global over the plan's shard group for a bridge's gradients."""
    ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    owner = _owner(ts) if ts else None
    if owner is None:
        return _ORIG["get_total_norm"](ts, norm_type, error_if_nonfinite, foreach)
    return total_norm(owner, ts, norm_type, error_if_nonfinite, foreach)


def register(fsdp):
    """Called by CommplanFSDP: wraps torch's get_total_norm (torch.nn.utils.get_total_norm, which
    torchtitan calls, and clip_grad._get_total_norm, which torch.nn.utils.clip_grad_norm_ calls)."""
    import torch.nn.utils.clip_grad as cg
    if not _ORIG:
        _ORIG["get_total_norm"] = cg._get_total_norm
        cg._get_total_norm = _get_total_norm
        torch.nn.utils.get_total_norm = _get_total_norm
    _LIVE.add(fsdp)


def unregister(fsdp):
    import torch.nn.utils.clip_grad as cg
    _LIVE.discard(fsdp)
    if not _LIVE and _ORIG:
        cg._get_total_norm = _ORIG["get_total_norm"]
        torch.nn.utils.get_total_norm = _ORIG.pop("get_total_norm")


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None, fsdp=None):
    """torchtitan's clip_grad_norm_ (torchtitan/distributed/utils.py:599, without pipeline or
    expert parallelism) for the bridge's parameters: the total norm of their gradients over the
    plan's shard group, every gradient shard scaled by min(1, max_norm / (total + 1e-6)).
    Returns the total norm (a 0-dim tensor, the same on every rank). fsdp: the CommplanFSDP (found
    from the parameters when omitted)."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    owner = fsdp if fsdp is not None else _owner(grads)
    if owner is None:  # not the bridge's: torch's own
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite, foreach)
    total = total_norm(owner, grads, norm_type, error_if_nonfinite, foreach)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach)
    return total


# ---- evaluation forwards -------------------------------------------------------------------

class EvalForward:
    """A CommplanFSDP's forwards under no_grad: each unit's parameters gathered into temporary
    tensors at its first module's forward and dropped after its last, on the shard group; no
    library call, nothing of the plan's state touched.

    A unit whose modules do not all run (the loss head's lm_head under torchtitan's
    _skip_lm_head, models/common/decoder.py:242-247) is dropped at the root's post-forward, as
    FSDP2's _force_complete_incomplete_states reshards it (torch 2.15 _fsdp_state.py:382-397).
    ChunkedLossWrapper's validation path (pred without grad: chunked forward only,
    components/loss.py:656, :729-772) calls lm_head.unshard() / reshard() around its chunks:
    hold() gathers the unit once and keeps it across the chunks' forwards, release() drops it.

    Under tensor parallelism each temporary carries the SPMD type and PartitionSpec of the
    training path's unsharded parameter (spmd_types' assert_type_like, as
    commplan.tensor_parallel gives them: fully_shard's _restore_spmd_types,
    torch/distributed/fsdp/_fully_shard/_fsdp_param.py:557), so torchtitan's TP code and its
    SPMD type checking run on it as in training; its TP collectives run in torch."""

    def __init__(self, fsdp):
        self.f = fsdp
        self.held = [False] * len(fsdp.units)    # gathered, its temporaries in the modules
        self.ran = [0] * len(fsdp.units)         # the unit's module forwards since the gather
        self.pinned = [False] * len(fsdp.units)  # held by the loss head's unshard() until reshard()

    def pre_forward(self, u):
        f = self.f
        if any(f.live) or any(f._fwd_started):
            raise PlanError("commplan: forward of %s under no_grad inside a training micro-step of plan %s (its "
                            "forward ran, its backward not yet): evaluate between micro-steps"
                            % (f.units[u]["name"], f.name))
        self._gather_unit(u)

    def post_forward(self, u):
        f = self.f
        self.ran[u] += 1
        if self.ran[u] >= len(f.units[u]["modules"]) and not self.pinned[u]:
            self._drop(u)
        if u == 0:  # the root's post-forward: units whose modules did not all run
            for v in range(1, len(f.units)):
                if self.held[v] and not self.pinned[v]:
                    self._drop(v)

    def hold(self, u):
        """The loss head's unshard() under no_grad: the unit gathered until release()."""
        self._gather_unit(u)
        self.pinned[u] = True

    def release(self, u):
        self.pinned[u] = False
        if self.held[u]:
            self._drop(u)

    def _gather_unit(self, u):
        f = self.f
        if self.held[u]:
            return
        unit = f.units[u]
        if unit["params"]:
            with torch.inference_mode(False), torch.no_grad():
                full = self._gather(unit)
            for P, t in zip(unit["params"], full):
                p = nn.Parameter(t, requires_grad=False)
                if f._tp is not None:
                    f._tp.type_like_unsharded(p, P)
                for mod, attr in P.owners:
                    mod._parameters[attr] = p
        self.held[u], self.ran[u] = True, 0

    def _drop(self, u):
        self.f._use(self.f.units[u], False)
        self.held[u], self.ran[u] = False, 0

    def _gather(self, unit):
        """The unit's parameters, full, in its param_dtype: one all-gather of the padded shards
        back to back (FSDP2's copy-in), each parameter's chunks concatenated on its shard dim."""
        import torch.distributed as dist
        f = self.f
        pg, W = shard_group(f)
        metas = [m for pu in f.plan["units"] if pu["index"] == unit["index"] for m in pu["params"]]
        sizes = [m["padded_numel"] for m in metas]
        total = sum(sizes)
        send = torch.zeros(total, dtype=unit["params"][0].sharded.dtype, device=unit["params"][0].sharded.device)
        off = 0
        for P, n in zip(unit["params"], sizes):
            send[off:off + P.sharded.numel()].copy_(P.sharded.reshape(-1))
            off += n
        if pg is None:
            recv = send
        else:
            recv = send.new_empty(total * W)
            dist.all_gather_into_tensor(recv, send, group=pg)
        out = []
        off = 0
        for m, n in zip(metas, sizes):
            k, shape, chunk = m.get("shard_dim", 0), list(m["shape"]), m["chunk"]
            parts = []
            for r in range(W):
                valid = max(0, min(chunk, shape[k] - r * chunk))
                local = shape[:k] + [valid] + shape[k + 1:]
                cnt = 1
                for d in local:
                    cnt *= d
                parts.append(recv[r * total + off:r * total + off + cnt].view(local))
            out.append(torch.cat(parts, dim=k).to(unit["ag_dtype"]))
            off += n
        return out
