"""The live FSDP2 peer: one process per rank, torch imported once, many
plans run in the same processes over one gloo process group.

A plan's model is rebuilt in PyTorch from its plan.json alone: the units
in wrapping order (fully_shard on every unit, then on the root, which owns
the root unit's parameters and may own none), each parameter with its full
shape, dtype, FSDP shard dim and TP placement (DTensor on the tp mesh dim),
the unit's MixedPrecisionPolicy (ag_dtype / reduce_dtype) and
reshard_after_forward, the mesh (dp_replicate x dp_shard x tp, ranks
row-major) built with DeviceMesh.from_group from process groups that are
created once and reused by every later plan.

Values are the binary's --pattern oracle (runtime/check.c): parameter k
(k = 100 * unit index in plan.json, root 0, + index in the unit) holds at
full flat index e the value k*1000 + e + step, rewritten into the local
shards before every step (as an optimizer would); the gradient FSDP2 sees
for the unsharded parameter on global rank r in micro-step m is
((e + k) % 5 + 1) * (r + 1) * (m + 1) in the compute dtype, injected by an
autograd Function (the forward carries a dummy activation through every
unit in order, so every unit's pre- and post-backward hooks fire as in a
layered model).

Every collective FSDP2 issues (all_gather_single, reduce_scatter_single,
all_gather_into_tensor, reduce_scatter_tensor, all_reduce and the
older _base forms; funcol's all_reduce for TP Partial gradients) is
recorded per rank in issue order with its group, dtype, reduce op and full
input and output, in the format of ../shared/oracle (README there).

Gradient accumulation modes (job["accumulation"]):
  fsdp2_default      reduce-scatter (and all-reduce) on every micro-batch,
                     adding into the sharded grads (FSDP2's and torchtitan's default)
  sync_last          set_requires_gradient_sync(False) on every micro-batch but the
                     last (unsharded grads accumulate; FSDP2 keeps them in
                     reduce_dtype when it differs)
  all_reduce_last    HSDP: set_requires_all_reduce(False) on every micro-batch
                     but the last (reduce-scatter each time, all-reduce once)
  step_end           torch.distributed.pipelining's stage (stage.py): manual
                     backward finalization before each forward; every backward
                     with set_reshard_after_backward(False) and
                     set_requires_gradient_sync(False); after the last, both
                     back on and finalize_backward() (perform_reduce_grad)
Sharded grads are set to None before every step (optimizer.zero_grad()).

torchtitan's ChunkedLossWrapper (a plan with partial reductions, plan.json's op "params": the llama
and MoE families' training.loss_chunks >= 2, gen/parallel/fsdp_schedule.lua): the [norm, lm_head]
unit is two modules under one grouped fully_shard, as torchtitan wraps it; the decoder's forward
runs the norm alone and the loss runs the wrapper's protocol (components/loss.py): lm_head's
reshard after forward and backward and its gradient sync off, lm_head.unshard(), each chunk's
lm_head forward and backward on a detached copy of the hidden state (gradient sync on for the last:
lm_head's gradient is the pattern there, zero on the others, so the reduced value is the pattern),
the settings restored, lm_head.reshard(), and the decoder's backward from the chunks' summed input
gradient. The unit reshards after forward from the first step on (what the wrapper's first loss
leaves set: a model's very first forward, with it still off, skips the loss's all-gather).
"""
import json
import os
import queue
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ACCUMULATION = ("fsdp2_default", "sync_last", "all_reduce_last", "step_end")

# ----------------------------------------------------------------- patterns
# The binary's --pattern values (runtime/check.c cp_pattern_param and
# cp_pattern_grad), computed for whole index tensors. "oracle": the
# recordings' integers (every reduction exact by design); "unique": hashed
# values (16-bit parameters any finite bits; grads 1..1024 x (rank+1) in
# fp32, 1..8 x (rank+1) in 16 bits). job["unique_scaled"]: the 16-bit grads
# of odd micro-steps are 2^-6 smaller (the binary's check.c from issue 16's
# accumulation fix on; older binaries do not scale).

M64 = (1 << 64) - 1


def mix32(x):
    """runtime/check.c's mix32 over a numpy uint64 array."""
    import numpy as np
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xff51afd7ed558ccd)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xc4ceb9fe1a85ec53)
        x ^= x >> np.uint64(33)
    return x & np.uint64(0xffffffff)


def _bits16(h, dtype):
    import numpy as np
    h = h.astype(np.uint16)
    if dtype == torch.bfloat16:
        h = np.where((h & 0x7f80) == 0x7f80, h & ~np.uint16(0x4000), h).astype(np.uint16)
    else:
        h = np.where((h & 0x7c00) == 0x7c00, h & ~np.uint16(0x4000), h).astype(np.uint16)
    return torch.from_numpy(h.view(np.int16).copy()).view(dtype)


def param_values(pattern, dtype, k, base, idx, step):
    """Parameter k's values at full indices idx (int64 tensor), in dtype."""
    import numpy as np
    if pattern == "oracle":
        return (idx.to(torch.float64) + (k * 1000 + step)).to(torch.float32).to(dtype)
    if dtype == torch.float32:
        return ((idx + base + 1) % 4000000).to(torch.float32) + 0.25 * (step % 4)
    e = idx.reshape(-1).numpy().astype(np.uint64)
    h = mix32((np.uint64(k) << np.uint64(40)) ^ (e << np.uint64(8)) ^ np.uint64(step))
    return _bits16(h & np.uint64(0xffff), dtype).view(idx.shape)


def grad_values(pattern, dtype, k, idx, rank, micro, step, scaled=False):
    """The gradient of parameter k at full indices idx on rank in a
    micro-step, in dtype (the compute dtype)."""
    import numpy as np
    if pattern == "oracle":
        return (((idx + k) % 5 + 1) * (rank + 1) * (micro + 1)).to(torch.float32).to(dtype)
    span = 1024 if dtype == torch.float32 else 8
    e = idx.reshape(-1).numpy().astype(np.uint64)
    salt = np.uint64(((k << 32) & M64)) ^ np.uint64((step << 56) & M64) ^ np.uint64((micro * 0x9e3779b97f4a7c15) & M64)
    g = (np.uint64(1) + mix32(salt ^ e) % np.uint64(span)).astype(np.float32) * np.float32(rank + 1)
    if scaled and dtype != torch.float32 and micro & 1:
        g = g * np.float32(2.0 ** -6)
    return torch.from_numpy(g).view(idx.shape).to(dtype)


# ---------------------------------------------------------------- recording

_rec = threading.local()


class Recorder:
    def __init__(self):
        self.log = None  # a list while recording
        self.depth = 0

    def mark(self, what):
        if self.log is not None:
            self.log.append({"op": "mark", "what": what})


REC = Recorder()


def _ranks(group):
    if group is None:
        group = c10d._get_default_group()
    return [int(r) for r in dist.get_process_group_ranks(group)]


def _op_name(op):
    if op is None:
        return "RedOpType.SUM"
    if isinstance(op, dist.ReduceOp.RedOpType):
        return str(op)
    return "RedOpType." + str(getattr(op, "op", op)).split(".")[-1]


def _values(t):
    return t.detach().reshape(-1).to(torch.float64).tolist()


def _wrap(fn, kind):
    """kind: all_gather (out, in), reduce_scatter (out, in), all_reduce (tensor)."""

    def hooked(*args, **kwargs):
        if REC.log is None or REC.depth > 0:
            return fn(*args, **kwargs)
        REC.depth += 1
        try:
            if kind == "all_reduce":
                t = kwargs.get("tensor", args[0] if args else None)
                group = kwargs.get("group", args[2] if len(args) > 2 else None)
                op = kwargs.get("op", args[1] if len(args) > 1 else dist.ReduceOp.SUM)
                before = _values(t)
                work = fn(*args, **kwargs)
                if work is not None and kwargs.get("async_op", False):
                    work.wait()
                entry = {"op": "all_reduce", "ranks": _ranks(group), "dtype": str(t.dtype), "reduce_op": _op_name(op),
                         "in_numel": t.numel(), "out_numel": t.numel(), "in": before, "out": _values(t)}
            else:
                out = kwargs.get("output_tensor", kwargs.get("output", args[0] if args else None))
                inp = kwargs.get("input_tensor", kwargs.get("input", args[1] if len(args) > 1 else None))
                group = kwargs.get("group", args[3] if kind == "reduce_scatter" and len(args) > 3 else
                                   (args[2] if kind == "all_gather" and len(args) > 2 else None))
                before = _values(inp)
                work = fn(*args, **kwargs)
                if work is not None and kwargs.get("async_op", False):
                    work.wait()
                entry = {"op": kind, "ranks": _ranks(group), "dtype": str(inp.dtype)}
                if kind == "reduce_scatter":
                    op = kwargs.get("op", args[2] if len(args) > 2 else dist.ReduceOp.SUM)
                    entry["reduce_op"] = _op_name(op)
                entry.update({"in_numel": inp.numel(), "out_numel": out.numel(), "in": before, "out": _values(out)})
            REC.log.append(entry)
            return work
        finally:
            REC.depth -= 1

    hooked._commplan_hook = fn
    return hooked


def install_hooks():
    """Every path FSDP2 (torch 2.15: _fsdp_collectives.py calls
    dist.all_gather_single / dist.reduce_scatter_single / dist.all_reduce)
    or an older torch takes, in both namespaces it may be looked up in."""
    names = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
             "_all_gather_base": "all_gather", "reduce_scatter_single": "reduce_scatter",
             "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
             "all_reduce": "all_reduce"}
    for name, kind in names.items():
        for mod in (dist, c10d):
            fn = getattr(mod, name, None)
            if fn is not None and not hasattr(fn, "_commplan_hook"):
                setattr(mod, name, _wrap(fn, kind))
    # DTensor's redistribution (a TP Partial gradient -> Replicate in FSDP2's
    # post-backward) goes through functional collectives: record them too.
    try:
        import torch.distributed._functional_collectives as funcol
        orig = funcol.all_reduce

        def all_reduce_funcol(self, reduceOp, group, tag=""):
            res = orig(self, reduceOp, group, tag)
            if REC.log is not None and REC.depth == 0:
                out = res.wait() if hasattr(res, "wait") else res
                pg = funcol._resolve_group_name(group, tag) if hasattr(funcol, "_resolve_group_name") else None
                try:
                    ranks = _ranks(c10d._resolve_process_group(pg)) if isinstance(pg, str) else []
                except Exception:  # noqa: BLE001 - the ranks are informative only
                    ranks = []
                REC.log.append({"op": "all_reduce", "ranks": ranks, "dtype": str(self.dtype),
                                "reduce_op": "RedOpType." + str(reduceOp).upper(), "in_numel": self.numel(),
                                "out_numel": self.numel(), "in": _values(self), "out": _values(out), "funcol": True})
            return res

        all_reduce_funcol._commplan_hook = orig
        if not hasattr(funcol.all_reduce, "_commplan_hook"):
            funcol.all_reduce = all_reduce_funcol
    except Exception:  # noqa: BLE001
        pass


# ------------------------------------------------------------------- groups

_groups = {}


def get_group(ranks):
    """One gloo process group per rank list, created once: every rank of
    the pool calls this for every list, in the same order."""
    key = tuple(ranks)
    if key not in _groups:
        _groups[key] = dist.new_group(list(ranks), backend="gloo")
    return _groups[key]


def mesh_groups(R, S, T):
    """The rank lists of the three mesh dims (ranks row-major over R x S x T)."""
    fam = {"dp_replicate": [], "dp_shard": [], "tp": []}
    for s in range(S):
        for t in range(T):
            fam["dp_replicate"].append([r * S * T + s * T + t for r in range(R)])
    for r in range(R):
        for t in range(T):
            fam["dp_shard"].append([r * S * T + s * T + t for s in range(S)])
    for r in range(R):
        for s in range(S):
            fam["tp"].append([r * S * T + s * T + t for t in range(T)])
    return fam


# -------------------------------------------------------------------- model


class Tap(torch.autograd.Function):
    """Carries x through unchanged; the parameter's gradient is coef."""

    @staticmethod
    def forward(ctx, x, p, coef):
        ctx.coef = coef
        ctx.pshape = p.shape
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g, ctx.coef.view(ctx.pshape).clone(), None


class Unit(nn.Module):
    def __init__(self, params):
        super().__init__()
        for j, p in enumerate(params):
            self.register_parameter(f"p{j}", p)
        self.coefs = None  # per micro-step: one gradient per parameter (the unsharded TP-local shape)
        self.micro = 0

    def own_params(self):
        return [p for _, p in self.named_parameters(recurse=False)]

    def taps(self, x):
        for p, c in zip(self.own_params(), self.coefs[self.micro]):
            local = p.to_local(grad_placements=c[1]) if isinstance(p, DTensor) else p
            x = Tap.apply(x, local, c[0])
        return x

    def forward(self, x):
        return self.taps(x)


class HeadUnit(nn.Module):
    """ChunkedLossWrapper's [norm, lm_head] unit: its two parameters in two modules (one grouped
    fully_shard); the decoder's forward runs the norm alone, the loss lm_head (run_job)."""

    def __init__(self, params):
        super().__init__()
        self.norm = Unit(params[:1])
        self.lm = Unit(params[1:])

    def own_params(self):
        return self.norm.own_params() + self.lm.own_params()

    @property
    def coefs(self):
        return None

    @coefs.setter
    def coefs(self, coefs):
        if coefs is not None:
            self.norm.coefs = {m: c[:1] for m, c in coefs.items()}
            self.lm.coefs = {m: c[1:] for m, c in coefs.items()}

    @property
    def micro(self):
        return self.norm.micro

    @micro.setter
    def micro(self, m):
        self.norm.micro = self.lm.micro = m

    def forward(self, x):
        return self.norm(x)


class Root(Unit):
    def __init__(self, params, units):
        super().__init__(params)
        self.units = nn.ModuleList(units)

    def forward(self, x):
        x = self.taps(x)
        for u in self.units:
            x = u(x)
        return x


def chunk_of(t, n, dim, i):
    """torch.chunk's i-th of n pieces along dim, or an empty piece."""
    parts = torch.chunk(t, n, dim=dim)
    if i < len(parts):
        return parts[i]
    shape = list(t.shape)
    shape[dim] = 0
    return t.new_empty(shape)


# ---------------------------------------------------------------------- job


def run_job(rank, job):
    """Runs one plan on this rank; every rank of the pool calls it. Returns
    this rank's record (None for ranks outside the plan's world)."""
    plan = json.load(open(job["plan_json"]))
    par = plan["parallel"]
    # Context parallel: FSDP shards over dp_shard x cp (torchtitan 0.3), consecutive in the row-major
    # mesh, so they fold into one shard dim here; cp's K/V exchange is an activation collective
    # (tp_* op kinds on group cp), left out of the comparison as TP's are (live.py).
    R, S, T = par["dp_replicate"], par["dp_shard"] * par.get("cp", 1), par["tp"]
    world = plan["world_size"]
    for k in ("pp", "ep"):
        if par.get(k, 1) != 1:
            raise NotImplementedError(f"{k} = {par[k]}: the live peer builds dp_replicate x dp_shard (x cp) x tp "
                                      "meshes only")
    if R * S * T != world:
        raise ValueError(f"mesh {R} x {S} x {T} is not world {world}")
    if world > dist.get_world_size():
        raise ValueError(f"world {world} exceeds the pool's {dist.get_world_size()} ranks")
    fam = mesh_groups(R, S, T)
    # Every rank creates every group (new_group is collective over the pool).
    for name in ("dp_replicate", "dp_shard", "tp"):
        for ranks in fam[name]:
            get_group(ranks)
    # fully_shard(reshard_after_forward=k) builds its post-forward DeviceMesh (the dp mesh viewed as
    # (-1, k), torch 2.15 _fsdp_init.py:186-194) with new_group, collective over the pool on gloo: the
    # ranks outside the plan's world make the same calls, in the same (fully_shard) order
    post_forward = [u["post_forward"] for u in sorted(plan["units"], key=lambda u: u["index"])[1:]
                    if u.get("post_forward")]
    if rank >= world:
        dp = torch.arange(world).view(R, S, T)[:, :, 0] if R > 1 else torch.arange(world).view(R, S, T)[0, :, 0]
        for k in post_forward:
            DeviceMesh("cpu", dp.reshape(-1, k))
        return None

    rr, ss, tt = rank // (S * T), (rank // T) % S, rank % T
    mine = {name: next(g for g in fam[name] if rank in g) for name in fam}
    mesh = DeviceMesh.from_group([get_group(mine["dp_replicate"]), get_group(mine["dp_shard"]), get_group(mine["tp"])],
                                 "cpu", mesh=torch.arange(world).view(R, S, T),
                                 mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    dp_mesh = mesh["dp_replicate", "dp_shard"] if R > 1 else mesh["dp_shard"]
    tp_mesh = mesh["tp"]
    micro_steps = int(plan["fsdp"].get("micro_steps", 1))
    steps = int(job.get("steps", 1))
    accumulation = job.get("accumulation") or "sync_last"
    if accumulation not in ACCUMULATION:
        raise ValueError(f"accumulation {accumulation!r}: one of {', '.join(ACCUMULATION)}")
    reduce_sum = plan["fsdp"].get("reduce_op", "avg") == "sum"
    tp_partial = set(job.get("tp_partial") or [])  # parameters whose TP gradient is Partial (SP norms)

    pattern = job.get("pattern", "oracle")
    scaled = bool(job.get("unique_scaled"))
    units = sorted(plan["units"], key=lambda u: u["index"])
    infos = []  # (unit json, [(param json, k, full_shape, tp_dim, base)])
    modules = []
    base = 0  # the unique pattern's offset: full elements of every earlier parameter
    for u in units:
        plist, ps = [], []
        for j, q in enumerate(u["params"]):
            k = 100 * u["index"] + j
            full_shape = q.get("full_shape", q["shape"])
            tp_dim = q.get("tp_dim")
            numel = 1
            for d in full_shape:
                numel *= d
            dt = DTYPES[q.get("dtype", u["orig_dtype"])]
            full = param_values(pattern, dt, k, base, torch.arange(numel).view(full_shape), 0)
            # a frozen parameter (plan.json's "frozen": requires_grad=False, as torchtitan's LoRA
            # converter freezes its base weights): set before fully_shard, which keeps it
            trainable = not q.get("frozen")
            if T > 1:
                pl = [Shard(tp_dim)] if tp_dim is not None else [Replicate()]
                p = nn.Parameter(distribute_tensor(full, tp_mesh, pl, src_data_rank=None), requires_grad=trainable)
            else:
                p = nn.Parameter(full, requires_grad=trainable)
            plist.append((q, k, full_shape, tp_dim, base))
            ps.append(p)
            base += numel
        infos.append((u, plist))
        modules.append(ps)
    # ChunkedLossWrapper's [norm, lm_head] unit, where the plan reduces parts of a unit
    head_name = next((op["unit"] for op in plan["ops"] if op.get("params")), None)
    chunks = int((plan.get("audit") or {}).get("settings", {}).get("loss_chunks") or 1) if head_name else 1
    if head_name and (units[-1]["name"] != head_name or len(units[-1]["params"]) != 2):
        raise NotImplementedError(f"partial reductions of {head_name}: the live peer runs ChunkedLossWrapper's "
                                  "[norm, lm_head] unit, the last layer unit's two parameters, only")
    layer_units = [HeadUnit(ps) if u["name"] == head_name else Unit(ps) for u, ps in zip(units[1:], modules[1:])]
    head = layer_units[-1] if head_name else None
    root = Root(modules[0], layer_units)

    def mp_of(u, module):
        # A unit of mixed all-gather dtypes (plan.json: each parameter's ag_dtype):
        # MixedPrecisionPolicy.param_dtype_override_fn (torch 2.15 _fsdp_api.py:68-110)
        # keeps those parameters in their own dtype, and FSDP2 all-gathers uint8.
        own = {id(p): DTYPES[q["ag_dtype"]] for p, q in zip(module.own_params(), u["params"]) if "ag_dtype" in q}
        kw = {"param_dtype_override_fn": lambda p: own.get(id(p))} if own else {}
        return MixedPrecisionPolicy(param_dtype=DTYPES[u["ag_dtype"]], reduce_dtype=DTYPES[u["reduce_dtype"]], **kw)

    # fully_shard's ignored_params (plan.json's units): whole parameters on a submodule of the unit's
    # module (a ParameterList, outside own_params), unused by the forward, handed to fully_shard
    ignored = {}
    for u, m in zip(units, [root] + layer_units):
        if u.get("ignored_params"):
            m.ignored = nn.ParameterList([nn.Parameter(torch.zeros(q["shape"], dtype=DTYPES[q["dtype"]]))
                                          for q in u["ignored_params"]])
            ignored[u["name"]] = set(m.ignored.parameters())

    def offload_of(u):
        # CPU offload (plan.json's unit "cpu_offload"): on a CPU mesh FSDP2's H2D and D2H are
        # .to("cpu") no-ops, so this shows its collectives and reduced gradients under the
        # policy, not the copies; pin_memory=True needs a CUDA driver (tensor.pin_memory()
        # raises without one), so pinned units run unpinned here: pinning moves no value.
        return CPUOffloadPolicy(pin_memory=False) if u.get("cpu_offload") else OffloadPolicy()

    for u, m in zip(units[1:], layer_units):
        # (an int k: the plan's post-forward group size, fully_shard's reshard_after_forward=k)
        raf = u.get("post_forward") or u["reshard_after_forward"]
        fully_shard([m.norm, m.lm] if m is head else m, mesh=dp_mesh, reshard_after_forward=raf, mp_policy=mp_of(u, m),
                    shard_placement_fn=_placement_fn(m, u), ignored_params=ignored.get(u["name"]),
                    offload_policy=offload_of(u))
    if head is not None:
        head.lm.set_reshard_after_forward(True)  # as the wrapper's first loss leaves it (the docstring)
    fully_shard(root, mesh=dp_mesh, mp_policy=mp_of(units[0], root), shard_placement_fn=_placement_fn(root, units[0]),
                ignored_params=ignored.get(units[0]["name"]), offload_policy=offload_of(units[0]))
    # FSDP2 took each unit's policy as the plan says (torch 2.15 _fsdp_param.py:241)
    for u, m in zip(units, [root] + [x.norm if x is head else x for x in layer_units]):
        pg = m._get_fsdp_state()._fsdp_param_group
        if pg is not None and any(fp.offload_to_cpu != bool(u.get("cpu_offload")) for fp in pg.fsdp_params):
            raise AssertionError(f"unit {u['name']}: FSDP2's offload_to_cpu is not the plan's cpu_offload")
    for name, ps in ignored.items():  # FSDP2 left them whole: plain tensors, every element
        for p in ps:
            if isinstance(p, DTensor) or p.numel() != p.data.numel():
                raise AssertionError(f"unit {name}: fully_shard sharded an ignored parameter")
    for u, m in zip(units, [root] + [x.norm if x is head else x for x in layer_units]):
        factor, force = u.get("gradient_divide_factor"), bool(u.get("force_sum_reduction_for_comms"))
        if (factor is None and reduce_sum) or (factor is not None and float(factor) == 1.0 and not force):
            # commplan's reduce_op = "sum": divide factor 1. FSDP2 would reduce
            # fp32/bf16 with PREMUL_SUM(1.0), which gloo lacks; forcing SUM is the
            # same arithmetic (and what FSDP2 does for fp16 at factor 1); so for a
            # unit's own factor 1.
            factor, force = 1.0, True
        # the plan's set_gradient_divide_factor / set_force_sum_reduction_for_comms
        # (plan.json's units: each unit's own, else the plan's)
        if factor is not None:
            m.set_gradient_divide_factor(float(factor))
        if force:
            m.set_force_sum_reduction_for_comms(True)

    # Index maps: local shard element -> full flat index (torch.chunk over
    # TP, then over FSDP's shard dim), checked against what fully_shard made.
    all_mods = [root] + layer_units
    maps = []
    for (u, plist), m in zip(infos, all_mods):
        um = []
        for (q, k, full_shape, tp_dim, pbase), p in zip(plist, m.own_params()):
            numel = 1
            for d in full_shape:
                numel *= d
            idx = torch.arange(numel).view(full_shape)
            tp_local = chunk_of(idx, T, tp_dim, tt) if (T > 1 and tp_dim is not None) else idx
            local = chunk_of(tp_local, S, q["shard_dim"], ss).contiguous()
            loc = p.to_local() if isinstance(p, DTensor) else p
            # (An empty TP-local tensor sharded on dim k > 0: FSDP2 makes a
            # (0, 0) local shard where torch.chunk gives (0, c); both are empty.)
            if tuple(loc.shape) != tuple(local.shape) and not (loc.numel() == 0 and local.numel() == 0):
                raise AssertionError(f"{q['name']}: local shard {tuple(loc.shape)}, expected {tuple(local.shape)}")
            if loc.numel() == 0:
                local = local.reshape(loc.shape)
            want = param_values(pattern, loc.dtype, k, pbase, local, 0)
            if not torch.equal(loc.detach().float(), want.float()):
                raise AssertionError(f"{q['name']}: fully_shard's local shard is not the torch.chunk of its TP-local tensor")
            um.append((q, k, local, tp_local.contiguous(), pbase, DTYPES[q.get("ag_dtype", u["ag_dtype"])]))
        maps.append(um)

    def set_grads(step, micro):
        for um, m in zip(maps, all_mods):
            m.coefs = {micro: [(grad_values(pattern, ag, k, tpl, rank, micro, step, scaled).view(tpl.shape),
                                [Partial()] if q["name"] in tp_partial else None)
                               for (q, k, local, tpl, pbase, ag) in um]}
            m.micro = micro

    params_local = {}
    for um, m in zip(maps, all_mods):
        for (q, *_), p in zip(um, m.own_params()):
            loc = p.to_local() if isinstance(p, DTensor) else p
            params_local[q["name"]] = {"shape": list(loc.shape), "stride": list(loc.stride()),
                                       "placements": str(getattr(p, "placements", "")), "values": _values(loc)}

    kept = [(u, m) for u, m in zip(units, all_mods) if u.get("reshard_after_backward") is False and m is not head]
    # explicit prefetching: FSDPModule.set_modules_to_forward_prefetch / _backward_prefetch, as plan.json names them
    mod_of = {u["name"]: m for u, m in zip(units, all_mods)}
    for u, m in zip(units, all_mods):
        if u.get("forward_prefetch"):
            m.set_modules_to_forward_prefetch([mod_of[n] for n in u["forward_prefetch"]])
        if u.get("backward_prefetch"):
            m.set_modules_to_backward_prefetch([mod_of[n] for n in u["backward_prefetch"]])
    # FSDPModule.set_unshard_in_backward(False) (plan.json's units: unshard_in_backward false; per
    # FSDP state, torch 2.15 _fully_shard.py:1000-1009): the taps' backward needs no parameter values
    for u, m in zip(units, all_mods):
        if u.get("unshard_in_backward") is False:
            m.set_unshard_in_backward(False)
    log = []
    REC.log = log
    try:
        for step in range(steps):
            with torch.no_grad():
                for um, m in zip(maps, all_mods):
                    for (q, k, local, tpl, pbase, ag), p in zip(um, m.own_params()):
                        loc = p.to_local() if isinstance(p, DTensor) else p
                        loc.copy_(param_values(pattern, loc.dtype, k, pbase, local, step))
                        p.grad = None
            REC.mark(f"step{step}_forward")
            for micro in range(micro_steps):
                last = micro == micro_steps - 1
                if accumulation == "sync_last":
                    root.set_requires_gradient_sync(last)
                elif accumulation == "all_reduce_last":
                    root.set_requires_gradient_sync(True)
                    root.set_requires_all_reduce(last)
                elif accumulation == "step_end":  # _PipelineStageBase.forward_one_chunk / backward_maybe_with_nosync
                    root.set_manual_backward_finalization(True)
                # a unit's own accumulation (plan.json's units): its FSDPModule's setters alone,
                # after the recursive call above
                for u, m in zip(units, [root] + [x.norm if x is head else x for x in layer_units]):
                    own = u.get("grad_accumulation")
                    if own:
                        m.set_requires_gradient_sync(last or own != "sync_last", recurse=False)
                        if own == "all_reduce_last":
                            m.set_requires_all_reduce(last, recurse=False)
                # set_reshard_after_backward(False) on the units the plan keeps unsharded from one
                # backward into the next forward, back on for the step's last (docs/plan-files.md)
                for u, m in kept:
                    m.set_reshard_after_backward(last, recurse=False)
                set_grads(step, micro)
                # the model's input: requires grad unless the plan's carries none (a generic plan's
                # model.input_requires_grad = false, as token ids: the frozen prefix)
                x = torch.zeros(1, requires_grad=plan.get("input_requires_grad", True))
                out = root(x)
                if head is not None:  # ChunkedLossWrapper's loss, then the decoder's backward (the docstring)
                    chunked_loss(head, out, chunks, micro, lambda: REC.mark(f"step{step}_backward") if micro == 0
                                 else None)
                    continue
                if micro == 0:
                    REC.mark(f"step{step}_backward")
                if accumulation == "step_end":
                    root.set_reshard_after_backward(False)
                    root.set_requires_gradient_sync(False)
                out.float().sum().backward()
            if accumulation == "step_end":  # perform_reduce_grad: start_ and wait_for_gradient_reduction
                root.set_requires_gradient_sync(True)
                root.set_reshard_after_backward(True)
                root.finalize_backward(async_op=True).wait()
                root.set_manual_backward_finalization(False)
    finally:
        REC.log = None

    grads_local = {}
    for um, m in zip(maps, all_mods):
        for (q, *_), p in zip(um, m.own_params()):
            g = p.grad
            if q.get("frozen"):  # never reduced: FSDP2 left it without a gradient (commplan's dump has none)
                if g is not None or p.requires_grad:
                    raise AssertionError(f"{q['name']}: frozen, but fully_shard gave it a gradient")
                continue
            if g is None:
                grads_local[q["name"]] = {"shape": None, "values": []}
                continue
            g = g.to_local() if isinstance(g, DTensor) else g
            grads_local[q["name"]] = {"shape": list(g.shape), "dtype": str(g.dtype), "values": _values(g)}
    return {"config": {"name": job["name"], "mesh": plan["mesh"]["sizes"], "mesh_names": plan["mesh"]["names"],
                       "torch": torch.__version__, "accumulation": accumulation, "steps": steps,
                       "pattern": pattern},
            "rank": rank, "world": world, "params_local": params_local, "grads_local": grads_local, "log": log}


def chunked_loss(head, hidden, chunks, micro, mark):
    """torchtitan 0.3's ChunkedLossWrapper.__call__ (components/loss.py) on the head unit's lm_head,
    then the decoder's backward from the chunks' summed input gradient. mark(): after the loss's
    unshard (where the binary's dump marks the backward: after the step's last forward op)."""
    lm = head.lm
    coefs = lm.coefs[micro]
    zero = [(torch.zeros_like(c), pl) for c, pl in coefs]
    lm.set_reshard_after_forward(False)
    lm.set_reshard_after_backward(False)
    lm.set_requires_gradient_sync(False, recurse=False)
    lm.unshard()
    mark()
    acc = torch.zeros_like(hidden)
    for i in range(chunks):
        last = i == chunks - 1
        if last:
            lm.set_requires_gradient_sync(True, recurse=False)
        lm.coefs = {micro: coefs if last else zero}  # lm_head's gradient: the pattern once, on the last chunk
        h = hidden.detach().requires_grad_(True)
        lm(h).float().sum().backward()
        acc += h.grad
    lm.coefs = {micro: coefs}
    lm.set_reshard_after_forward(True)
    lm.set_reshard_after_backward(True)
    lm.set_requires_gradient_sync(True, recurse=False)
    lm.reshard()
    hidden.backward(acc)


def _placement_fn(module, u):
    dims = {id(p): q["shard_dim"] for p, q in zip(module.own_params(), u["params"])}

    def fn(p):
        d = dims.get(id(p), 0)
        return Shard(d) if d else None

    return fn


# ------------------------------------------------------------------- worker


def worker_main(rank, nranks, init_file, jobs, results, timeout_s):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import warnings
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=nranks,
                            timeout=timedelta(seconds=timeout_s))
    install_hooks()
    results.put(("ready", rank, None, torch.__version__))
    parent = os.getppid()
    while True:
        try:
            job = jobs.get(timeout=5)
        except queue.Empty:
            if os.getppid() != parent:  # the driver is gone: do not linger
                break
            continue
        if job is None:
            break
        t0 = time.time()
        try:
            rec = run_job(rank, job)
            if rec is not None:
                os.makedirs(job["out_dir"], exist_ok=True)
                path = os.path.join(job["out_dir"], f"{job['name']}.rank{rank}.json")
                with open(path + ".tmp", "w") as f:
                    json.dump(rec, f, separators=(",", ":"))
                os.replace(path + ".tmp", path)
            dist.barrier()
            results.put(("done", rank, job["id"], time.time() - t0))
        except Exception:  # noqa: BLE001 - reported to the driver, which restarts the pool
            results.put(("error", rank, job["id"], traceback.format_exc()))
            break
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


if __name__ == "__main__":
    sys.exit("tests/live/record.py is the rank worker; run tests/live/live.py")
