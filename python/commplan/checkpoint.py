"""Checkpoints of a CommplanFSDP model in FSDP2's sharded form (DTensors), for
torch.distributed.checkpoint (DCP).

    sd = {"model": fsdp.state_dict(), "optim": optim_state_dict(fsdp, opt)}
    dcp.save(sd, checkpoint_id=path)                    # or, to resume:
    dcp.load(sd, checkpoint_id=path); fsdp.load_state_dict(sd["model"]); load_optim_state_dict(fsdp, opt, sd["optim"])

The state dict is the one fully_shard's model gives (torch/distributed/fsdp/_fully_shard/
_fsdp_state.py: the module's state_dict with its sharded DTensor parameters): the model's own
FQNs (every name a parameter has, tied ones included; buffers as plain tensors), each parameter
a DTensor over the data-parallel mesh with fully_shard's placements (_fsdp_param.py
_init_sharded_param): (Shard(d),) on the dp_shard mesh, (Replicate(), Shard(d)) on HSDP's
(dp_replicate, dp_shard) mesh, d the plan's shard dim (0, or the param's shard_dim); under
tensor parallelism fully_shard + TP's 2-D / 3-D placements on the (dp_replicate,) dp_shard, tp
mesh, e.g. (_StridedShard(0, sf=tp), Shard(0)) for a colwise weight (commplan.tensor_parallel). Its local
tensor is this rank's unpadded shard, a view of the plan's sharded storage (no copy): the chunk
torch.chunk gives (ceil(n / W) rows per rank, the last ranks' shorter or empty), which is both
FSDP2's and DTensor's uneven Shard, so DCP's offsets agree and a checkpoint written by fully_shard
loads here and the reverse, on the same mesh or another (FSDP 4 -> HSDP 2x2, 4 -> 2 ranks): DCP
reshards by global offsets.

The bridge owns no optimizer. The user's optimizer is over the sharded parameters (plain tensors,
this rank's shards), so torch.distributed.checkpoint.state_dict's get_optimizer_state_dict on the
bridge's module gives its state keyed by the model's FQNs, as fully_shard's does; optim_state_dict
wraps each per-element state (exp_avg, exp_avg_sq: the parameter's local shape) into the
parameter's DTensor and leaves scalars (step) plain, as fully_shard's DTensor parameters make
them; load_optim_state_dict unwraps and calls set_optimizer_state_dict.

The model's DTensors view the plan's storage: they follow training, and close() frees them
(clone what must outlive the bridge). Call these between steps (every unit resharded), on every rank (the mesh is made once, a
collective, unless passed as mesh=).
"""

import contextlib

import torch

from .planfile import PlanError
from .match import plan_units
from .recompute import clean_fqn

__all__ = ["dp_mesh", "state_dict", "load_state_dict", "optim_state_dict", "load_optim_state_dict", "as_dtensor"]


def dp_mesh(fsdp, mesh=None):
    """The data-parallel DeviceMesh the DTensors live on: fully_shard's (dp_shard,) or HSDP's
    (dp_replicate, dp_shard), made with init_device_mesh from plan.json's parallel unless given."""
    if getattr(fsdp, "_tp", None) is not None:  # under TP: fully_shard + TP's storage mesh (tensor_parallel)
        return fsdp._tp.mesh if mesh is None else fsdp._tp.check_mesh(mesh)
    if mesh is None:
        mesh = getattr(fsdp, "_ckpt_mesh", None)
    par = fsdp.plan.get("parallel", {})
    R, W = par.get("dp_replicate", 1), par["dp_shard"]
    if mesh is None:
        from torch.distributed.device_mesh import init_device_mesh
        dev = fsdp.params[0].sharded.device.type if fsdp.params else "cpu"
        mesh = init_device_mesh(dev, (R, W), mesh_dim_names=("dp_replicate", "dp_shard")) if R > 1 \
            else init_device_mesh(dev, (W,), mesh_dim_names=("dp_shard",))
    want = (R, W) if R > 1 else (W,)
    if tuple(mesh.shape) != want:
        raise PlanError("plan %s shards over a %s mesh (parallel.dp_replicate x dp_shard); the mesh given is %s"
                        % (fsdp.name, "x".join(map(str, want)), "x".join(map(str, mesh.shape))))
    if mesh.get_local_rank(mesh.ndim - 1) != fsdp.lib.shard_rank:
        raise PlanError("plan %s: this rank holds shard %d, but its coordinate on the mesh's dp_shard dim is %d; "
                        "make the mesh as init_device_mesh does (dp_replicate outer, dp_shard inner)"
                        % (fsdp.name, fsdp.lib.shard_rank, mesh.get_local_rank(mesh.ndim - 1)))
    fsdp._ckpt_mesh = mesh
    return mesh


def _specs(fsdp, mesh):
    """id(sharded parameter) -> (param, placements, global shape)."""
    from torch.distributed.tensor import Replicate, Shard
    if getattr(fsdp, "_tp", None) is not None:
        return fsdp._tp.specs()
    out = {}
    metas = [m for u in plan_units(fsdp.plan) for m in u["params"]]
    for P, meta in zip(fsdp.params, metas):
        shard = Shard(meta.get("shard_dim", 0))
        out[id(P.sharded)] = (P, (Replicate(), shard) if mesh.ndim == 2 else (shard,), torch.Size(meta["shape"]))
    return out


def _dtensor(local, placements, shape, mesh):
    from torch.distributed.tensor import DTensor
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)


def _check_resharded(fsdp, what):
    if any(fsdp.live):
        raise PlanError("%s of plan %s during a step (unit %s is unsharded): call it between optimizer steps"
                        % (what, fsdp.name, fsdp.units[fsdp.live.index(True)]["name"]))


@contextlib.contextmanager
def _as_dtensors(fsdp, mesh):
    """The model as fully_shard leaves it: every sharded parameter replaced, in each module holding
    it, by a DTensor parameter over its local shard (a view, no copy), so that the model's own
    state-dict hooks see what they see under fully_shard (torchtitan's fused wqkv is saved split
    into wq / wk / wv by a hook that reshapes the global tensor: torchtitan/models/common/
    attention.py:871 _split_qkv_on_save, which on a plain local shard fails)."""
    specs = _specs(fsdp, mesh)
    swapped, made = [], {}
    for mod in fsdp.model.modules():
        for attr, p in list(mod._parameters.items()):
            s = specs.get(id(p)) if p is not None else None
            if s is None:
                continue
            if id(p) not in made:
                made[id(p)] = torch.nn.Parameter(_dtensor(p.detach(), s[1], s[2], mesh), requires_grad=p.requires_grad)
            mod._parameters[attr] = made[id(p)]
            swapped.append((mod, attr, p))
    try:
        yield
    finally:
        for mod, attr, p in swapped:
            mod._parameters[attr] = p


def _load_pre_hooks(model, sd):
    """sd as the model's load_state_dict pre-hooks leave it (torchtitan's merge of wq / wk / wv into
    the fused wqkv, attention.py:901 _merge_qkv_on_load), each module's hooks with its prefix, as
    torch's Module.load_state_dict runs them; on a shallow copy."""
    sd = dict(sd)
    for name, mod in model.named_modules():
        for hook in mod._load_state_dict_pre_hooks.values():
            hook(sd, name + "." if name else "", {}, True, [], [], [])
    return sd


def _own_entries(model):
    """{FQN: parameter or persistent buffer} as Module.state_dict(keep_vars=True) names them before
    its hooks (which may reshape the tensors: _as_dtensors)."""
    out = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        pre = name + "." if name else ""
        for attr, p in mod._parameters.items():
            if p is not None:
                out[pre + attr] = p
        for attr, b in mod._buffers.items():
            if b is not None and attr not in mod._non_persistent_buffers_set:
                out[pre + attr] = b
    return out


def state_dict(fsdp, mesh=None):
    """The model's state dict as fully_shard's: {FQN: DTensor (parameters), tensor (buffers)},
    the model's state-dict hooks applied as under fully_shard (_as_dtensors)."""
    _check_resharded(fsdp, "state_dict")
    mesh = dp_mesh(fsdp, mesh)
    with _as_dtensors(fsdp, mesh):
        return fsdp.model.state_dict()


def _local_of(v, P, placements, mesh, key):
    """This rank's shard of a loaded value: a DTensor's local tensor when laid out as ours, else
    its slice of the full tensor (a collective: every rank loads the same keys)."""
    from torch.distributed.tensor import DTensor
    if isinstance(v, DTensor):
        if tuple(v.placements) == tuple(placements) and tuple(v.device_mesh.shape) == tuple(mesh.shape):
            return v.to_local()
        v = v.full_tensor()
    if mesh.ndim > 1 and mesh.mesh_dim_names[-1] == "tp":  # FSDP x TP: this rank's piece of the global tensor
        from .tensor_parallel import local_piece
        return local_piece(v, mesh, placements)
    k = placements[-1].dim
    n, W, r = v.shape[k], mesh.size(mesh.ndim - 1), mesh.get_local_rank(mesh.ndim - 1)
    chunk = -(-n // W)
    return v.narrow(k, min(n, r * chunk), max(0, min(chunk, n - r * chunk)))


def load_state_dict(fsdp, sd, strict=True, mesh=None):
    """Copies a state dict (fully_shard's form, or full tensors) into the plan's sharded storage."""
    _check_resharded(fsdp, "load_state_dict")
    mesh = dp_mesh(fsdp, mesh)
    specs = _specs(fsdp, mesh)
    own = _own_entries(fsdp.model)
    sd = _load_pre_hooks(fsdp.model, sd)
    if strict:
        missing = [k for k in own if k not in sd]
        extra = [k for k in sd if k not in own]
        if missing or extra:
            raise KeyError("commplan: load_state_dict for plan %s: %s %r" % (
                fsdp.name, "missing key" if missing else "unexpected key", (missing or extra)[0]))
    with torch.no_grad():
        for k, t in own.items():
            if k not in sd:
                continue
            s = specs.get(id(t))
            if s is None:
                t.copy_(sd[k])
                continue
            P, placements, shape = s
            v = sd[k]
            if tuple(v.shape) != tuple(shape):
                raise ValueError("commplan: load_state_dict for plan %s: %s has shape %s, the plan's is %s"
                                 % (fsdp.name, k, tuple(v.shape), tuple(shape)))
            local = _local_of(v, P, placements, mesh, k)
            if local.data_ptr() != P.sharded.data_ptr() or local.numel() == 0:
                P.sharded.copy_(local)


def as_dtensor(fsdp, fqn, local, mesh=None):
    """local (a tensor of parameter fqn's local shard shape: an optimizer's per-element state) as a
    DTensor in that parameter's layout, a view; any other value unchanged. For optimizer state
    dicts in other forms than torch's (torchtitan's OptimizersContainer: flat keys
    state.{fqn}.{name}, torchtitan/components/optimizer/utils.py:71)."""
    mesh = dp_mesh(fsdp, mesh)
    specs = _specs(fsdp, mesh)
    # by the model's own FQN (checkpoint_wrapper's segment dropped, recompute.py)
    p = {clean_fqn(n): p for n, p in fsdp.model.named_parameters(remove_duplicate=False)}.get(clean_fqn(fqn))
    s = specs.get(id(p)) if p is not None else None
    if s is None or not isinstance(local, torch.Tensor) or local.dim() == 0 or local.shape != p.shape:
        return local
    return _dtensor(local, s[1], s[2], mesh)


def optim_state_dict(fsdp, optimizer, mesh=None):
    """The optimizer's state dict as fully_shard's model gives it through torch.distributed.
    checkpoint.state_dict.get_optimizer_state_dict: keyed by FQN, per-element state as DTensors.
    Initializes an empty optimizer's state first (a zero step, as get_optimizer_state_dict does),
    so the result is a template dcp.load can fill."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    _check_resharded(fsdp, "optim_state_dict")
    mesh = dp_mesh(fsdp, mesh)
    specs = _specs(fsdp, mesh)
    by_fqn = {}
    for k, v in fsdp.model.named_parameters(remove_duplicate=False):
        if id(v) in specs:  # the model's FQNs, as get_optimizer_state_dict keys them under AC (recompute.py)
            by_fqn[clean_fqn(k)] = specs[id(v)]
    osd = get_optimizer_state_dict(fsdp.model, optimizer)
    state = {}
    for fqn, st in osd["state"].items():
        P, placements, shape = by_fqn[fqn]
        state[fqn] = {n: _dtensor(x, placements, shape, mesh)
                      if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape == P.sharded.shape else x
                      for n, x in st.items()}
    return {"state": state, "param_groups": osd["param_groups"]}


def load_optim_state_dict(fsdp, optimizer, osd, mesh=None):
    """Loads an optimizer state dict in fully_shard's form (DTensors keyed by FQN) into the
    user's optimizer over the bridge's sharded parameters (set_optimizer_state_dict)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    _check_resharded(fsdp, "load_optim_state_dict")
    mesh = dp_mesh(fsdp, mesh)
    specs = _specs(fsdp, mesh)
    by_fqn = {clean_fqn(k): specs[id(v)] for k, v in fsdp.model.named_parameters(remove_duplicate=False)
              if id(v) in specs}
    state = {}
    for fqn, st in osd["state"].items():
        P, placements, _ = by_fqn[fqn]
        state[fqn] = {n: _local_of(x, P, placements, mesh, fqn).clone() if hasattr(x, "to_local") else x
                      for n, x in st.items()}
    set_optimizer_state_dict(fsdp.model, optimizer, {"state": state, "param_groups": osd["param_groups"]})
