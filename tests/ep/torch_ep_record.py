#!/usr/bin/env python3
"""torchtitan 0.3's expert parallelism run live on CPU (gloo), recorded
(issue 23, item 6, the torch side): what each rank really issues in one
training step (forward + backward, no optimizer step), for a comparison with
commplan's EP tables.

The model (a case's "family"; tests/ep/ep_cases.py): torchtitan's own
Qwen3 MoE decoder (Qwen3Model from _build_qwen3_moe_layers: GQA attention
with q/k norms, an MoE without shared experts in every block; "mixtral",
commplan's, is it without the q/k norms: torchtitan has no Mixtral),
parallelized by parallelize_qwen3 (its TP plan models/qwen3/sharding.py);
or torchtitan's own DeepSeek-V3 decoder (DeepSeekV3Model built from
torchtitan's _build_dsv3_layers), tiny: dim 16, 3 layers, the first dense
(FeedForward), the others MoE (torchtitan's MoE: TokenChoiceTopKRouter,
RoutedExperts = GroupedExperts + AllToAllTokenDispatcher, one shared expert),
MLA attention (q_lora_rank 0), fp32 parameters.

The router is torchtitan's own, with its debug switch
_debug_force_load_balance on: on every rank token t (0..B*L-1 of the rank's
local batch, flattened) goes to experts (t*K + j) mod E, j = 0..K-1; the
gate still runs (its scores weigh the expert outputs, so the gate gets
gradients). Routing is therefore fixed and known: with T = B*L tokens per
rank, expert e receives #{(t, j): (t*K + j) mod E == e} tokens from each rank
(recorded per layer as "routing").

Parallelized exactly as torchtitan 0.3 does (its default spmd_backend
"spmd_types", as the Trainer sets it): ParallelDims(dp_shard, ep, tp; a
case's tp > 1 runs torchtitan's TP plan of the model with its defaults,
sequence and loss parallelism: model.parallelize applies the TP plan with
the EP one, the loss is torchtitan's vocab-parallel cross-entropy)
.build_mesh(), parallelize_deepseekv3 (model.parallelize: experts Shard(0)
over ep, the AllToAllTokenDispatcher wired to the ep mesh;
apply_fsdp_to_decoder: dense parameters on the dp_shard mesh, routed-expert
weights on the efsdp mesh, Shard(1) when efsdp*ep > num_experts, explicit
forward/backward prefetching under EP, gradient division off; a case's
"ac" is torchtitan's own activation checkpointing, FullAC.Config() or
SelectiveAC.Config() as the Trainer's --activation_checkpoint builds it,
which parallelize_deepseekv3 applies to every block before fully_shard),
built on the
meta device, to_empty + init_weights as the Trainer does. One step as
Trainer._forward_backward_body runs it: its SPMD context, inputs annotated,
model, torchtitan's cross_entropy_loss, backward.

CPU/gloo: nothing is changed in the communication. FlexAttention, which has
no backward on CPU, is replaced by causal SDPA on the same tensors
(tests/titan/titan_env.cpu_training); FSDP2's reduce op is forced to SUM
(set_force_sum_reduction_for_comms; torchtitan's divide factor is 1 anyway,
gloo has no PREMUL_SUM/AVG). torch._grouped_mm runs on CPU (bf16) as is.
One workaround touches a collective's form, not its data: gloo's list
all_to_all refuses chunks of unequal shapes, which the token dispatch and
combine have under routing; spmd_types' own seam (spmd_types._dist.set_dist)
gets a torch.distributed whose all_to_all issues those as one
all_to_all_single with the same per-peer split sizes on the same group
(GlooDist below; recorded as c10d.alltoall_base_ with via "dist.all_to_all
(uneven: all_to_all_single)"); the equal-chunk token-count exchange stays
the list form (c10d.alltoall_). Each mesh (world, dp_shard, tp, ep) runs in
its own process group, its cases one after the other on one ParallelDims:
a second ParallelDims over the same dp_shard mesh in one process hands
fully_shard a cached DeviceMesh that is not its parameters'.

Recorded per rank, in issue order, by a TorchDispatchMode at the dispatcher:
every op of the c10d namespace (what torch.distributed's eager collectives
call on the ProcessGroup: _allgather_base_, _reduce_scatter_base_,
allreduce_, alltoall_, alltoall_base_, broadcast_, ...) and of
_c10d_functional (functional collectives; wait_tensor left out), so no
Python entry point is missed. Each event:
  {"i": index, "op": "c10d.alltoall_" | ..., "kind": all_gather |
   reduce_scatter | all_reduce | all_to_all | broadcast | barrier | other,
   "ranks": the group's global ranks, "group": its names in the case's mesh
   ("dp_shard" | "efsdp" | "ep" | "dp_shard=ep" when both are one group |
   "world" | ...), "in_numel", "out_numel",
   "dtype", "reduce_op" (reductions), "in_splits"/"out_splits" (all_to_all:
   rows per peer, dim 0), "row" (all_to_all: elements per row),
   "phase": "forward" | "backward", "module": the innermost module running
   (ModTracker's, e.g. "layers.1.moe.routed_experts"; in backward only
   approximate: the last module whose backward began), "ep": the token
   dispatcher's step ("layers.1 counts" | "layers.1 dispatch" | "layers.1
   combine", "... bwd" for their autograd backward), "fsdp": the FSDP
   param group in action ("layers.1 [efsdp] unshard", "layers.1 [dp_shard]
   post_backward", ... or ""), "via": the Python call that issued it
   ("dist.all_to_all", "dist.all_gather_into_tensor", ... or ""),
   "recompute": the block activation checkpointing re-runs in backward
   when it issued it ("layers.1": its wrapped module's forward running
   inside autograd's engine) or ""}.
Per rank also: "params": [{name, global shape, local shape, placements
[[mesh dim, placement]], dtype}], "grads": {name: sum of the local gradient
(float64)}, "routing": {layer: {"tokens_per_expert": local counts (E)}},
"loss".

Gradients (--plans DIR, DIR/<case>/plan.json commplan's plan of the case,
as tests/ep/check_ep_live.sh generates it): the model's own backward runs,
but each FSDP parameter's unsharded gradient, where FSDP2's post-backward
takes it to reduce, is replaced by commplan's oracle pattern (GradPattern
below: the parameter's id in the plan, the element's index in the full
parameter, the global rank). torchtitan's and FSDP2's code does the rest:
the groups (dp_shard, efsdp), the reduce op and divide factor (torchtitan
0.3's disable_fsdp_gradient_division: factor 1, PREMUL_SUM(1) = SUM), the
Shard(0)/Shard(1) shards. Recorded per rank: "grads_local": {name:
{"shape": local shape, "values": the reduced local shard, flattened}},
"grad_pattern": {"pattern", "micro", "ids": {name: commplan's id}}.

Output: one JSON per case, <out-dir>/<case>.json:
  {"case", "world", "dp_shard", "ep", "efsdp", "model": {...}, "seq",
   "batch", "torch", "torchtitan", "ranks": [per rank as above]}.
The cases: tests/ep/ep_cases.py.

Usage: torch_ep_record.py [--out-dir build/ep/live] [--cases a,b,...] [--plans DIR]
Exit 77 with a SKIP line when torch or torchtitan cannot be imported.
"""
import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "titan"))
sys.path.insert(0, HERE)
from ep_cases import CASES, DEFAULT, family, model_of, names_of, spec  # noqa: E402 - the case matrix, torch-free

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torchtitan  # noqa: F401
    import torchtitan.distributed.parallel_dims  # noqa: F401
    import torchtitan.models.deepseek_v3  # noqa: F401
except Exception as e:  # noqa: BLE001 - ImportError or a broken install
    print("SKIP ep-run: torch and torchtitan are not importable by %s (%s: %s)" % (sys.executable, type(e).__name__, e))
    sys.exit(77)


# ------------------------------------------------------------------ recording

class Recorder:
    def __init__(self):
        self.events = None
        self.fsdp = ""
        self.via = ""
        self.recompute = ""  # the block activation checkpointing re-runs in backward ("layers.1") or ""
        self.ep = ""     # the token dispatcher's step: "layers.1 counts" | "... dispatch" | "... combine" (+ " bwd")
        self.tls = threading.local()
        self.tracker = None
        self.group_names = {}

    def module(self):
        t = self.tracker
        if t is None:
            return "", ""
        parents = [p.split(".", 1)[1] for p in t.parents if "." in p]  # without the root's class name
        inner = max(parents, key=lambda p: (p.count("."), len(p))) if parents else ""
        return ("backward" if t.is_bw else "forward"), inner


REC = Recorder()
KIND = (("all_to_all", "all_to_all"), ("alltoall", "all_to_all"), ("allgather", "all_gather"),
        ("all_gather", "all_gather"), ("reduce_scatter", "reduce_scatter"), ("allreduce", "all_reduce"),
        ("all_reduce", "all_reduce"), ("broadcast", "broadcast"), ("barrier", "barrier"))


def _kind(name):
    for k, v in KIND:
        if k in name:
            return v
    return "other"


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    return []


def _pg_ranks(pg):
    from torch.distributed import distributed_c10d as c10d
    if isinstance(pg, str):
        pg = c10d._resolve_process_group(pg)
    elif not isinstance(pg, dist.ProcessGroup):  # the dispatcher's boxed ScriptObject
        pg = dist.ProcessGroup.unbox(pg)
    return [int(r) for r in dist.get_process_group_ranks(pg)]


def _record(func, args, kwargs, out):
    ns = func.namespace
    name = func.overloadpacket.__name__
    schema = func._schema
    bound = {}
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
    pg = None
    for k, v in bound.items():
        if k in ("process_group", "group_name", "group") or type(v).__name__ == "ProcessGroup":
            pg = v
    ranks = _pg_ranks(pg) if pg is not None else []
    kind = _kind(name)
    ins, outs = [], []
    for k, v in bound.items():
        ts = _tensors(v)
        if not ts:
            continue
        if k.startswith("output") or k == "out":
            outs.append((k, v))
        elif k.startswith("input") or k in ("tensors", "tensor", "self"):
            ins.append((k, v))
    ev = {"op": "%s.%s" % (ns, name), "kind": kind, "ranks": ranks,
          "group": REC.group_names.get(tuple(ranks), "?")}
    in_ts = [t for _, v in ins for t in _tensors(v)]
    out_ts = [t for _, v in outs for t in _tensors(v)]
    if ns == "_c10d_functional":
        out_ts = _tensors(out)
    if kind == "all_reduce" and not out_ts:
        out_ts = in_ts
    ev["in_numel"] = sum(t.numel() for t in in_ts)
    ev["out_numel"] = sum(t.numel() for t in out_ts)
    ev["dtype"] = str((in_ts or out_ts)[0].dtype).replace("torch.", "") if (in_ts or out_ts) else None
    for k in ("reduce_op", "reduceOp", "op"):
        if k in bound and bound[k] is not None and kind in ("all_reduce", "reduce_scatter"):
            op = bound[k]
            if not isinstance(op, (str, dist.ReduceOp)):
                op = dist.ReduceOp.unbox(op)
            if isinstance(op, dist.ReduceOp):
                op = op.op
            ev["reduce_op"] = str(op).split(".")[-1].lower()
    if kind == "all_to_all":
        if ns == "_c10d_functional":
            x = bound["input"]
            row = x[0].numel() if x.dim() and x.shape[0] else (x.numel() // max(1, x.shape[0] or 1))
            ev["in_splits"] = list(bound.get("input_split_sizes") or [x.shape[0] // len(ranks)] * len(ranks))
            ev["out_splits"] = list(bound.get("output_split_sizes") or [x.shape[0] // len(ranks)] * len(ranks))
            ev["row"] = int(row)
        elif name == "alltoall_":   # lists of per-peer chunks
            ic, oc = _tensors(bound["input_tensors"]), _tensors(bound["output_tensors"])
            ev["in_splits"] = [int(t.shape[0]) if t.dim() else 1 for t in ic]
            ev["out_splits"] = [int(t.shape[0]) if t.dim() else 1 for t in oc]
            rows = [t[0].numel() for t in ic + oc if t.dim() and t.shape[0]]
            ev["row"] = int(rows[0]) if rows else (int(ic[0].numel()) if ic and not ic[0].dim() else 0)
            ev["chunk_shapes_in"] = [list(t.shape) for t in ic]
        elif name == "alltoall_base_":
            x, y = bound["input"], bound["output"]
            ev["in_splits"] = list(bound.get("input_split_sizes") or [])
            ev["out_splits"] = list(bound.get("output_split_sizes") or [])
            # (elements per row from the shape: a rank that receives no token sends an empty input)
            ev["row"] = int(torch.Size(x.shape[1:]).numel()) if x.dim() else 0
    phase, module = REC.module()
    ev.update(phase=phase, module=module, fsdp=REC.fsdp, via=REC.via, ep=REC.ep, recompute=REC.recompute)
    ev["i"] = len(REC.events)
    REC.events.append(ev)


def make_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class CommMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            ns = func.namespace
            if REC.events is not None and (ns == "c10d" or (ns == "_c10d_functional" and "wait" not in
                                                            func.overloadpacket.__name__)):
                _record(func, args, kwargs, out)
            return out
    return CommMode()


def install_ep_labels():
    """Names the token dispatcher's all-to-alls: its three steps in forward
    (AllToAllTokenDispatcher._token_count_exchange, _dispatch_token_exchange,
    _combine_token_exchange), and in backward the autograd Function's
    backward of each (spmd_types' _AllToAllUneven / _AllToAllStack carry the
    label of the forward that built them)."""
    from torchtitan.models.common import token_dispatcher as TD
    import spmd_types._collectives as C

    def step(meth, label):
        orig = getattr(TD.AllToAllTokenDispatcher, meth)

        def hooked(self, *a, **k):
            saved = REC.ep
            REC.ep = "%s %s" % (getattr(self, "_ep_layer", "?"), label)
            try:
                return orig(self, *a, **k)
            finally:
                REC.ep = saved
        setattr(TD.AllToAllTokenDispatcher, meth, hooked)

    step("_token_count_exchange", "counts")
    step("_dispatch_token_exchange", "dispatch")
    step("_combine_token_exchange", "combine")
    for cls in (C._AllToAllUneven, C._AllToAllStack):
        fwd, bwd = cls.forward, cls.backward

        def forward(ctx, *a, _fwd=fwd, **k):
            ctx._ep_label = REC.ep
            return _fwd(ctx, *a, **k)

        def backward(ctx, *a, _bwd=bwd, **k):
            saved = REC.ep
            REC.ep = (ctx._ep_label + " bwd") if getattr(ctx, "_ep_label", "") else ""
            try:
                return _bwd(ctx, *a, **k)
            finally:
                REC.ep = saved
        cls.forward, cls.backward = staticmethod(forward), staticmethod(backward)


class GlooDist:
    """spmd_types' patchable torch.distributed (spmd_types._dist.set_dist, its
    documented seam), with one change: gloo's list all_to_all refuses chunks
    of unequal shapes (ProcessGroupGloo::alltoall: "invalid tensor size"),
    which routing gives the token dispatch and combine. Such a call is issued
    as one all_to_all_single over the concatenated chunks with the same
    per-peer split sizes: the same rows to the same peers in one collective
    on the same group (NCCL runs both forms as one group of send/recv).
    Equal chunks (the token-count exchange) go to dist.all_to_all as they are."""

    def __getattr__(self, name):
        return getattr(dist, name)

    def all_to_all(self, output_tensor_list, input_tensor_list, group=None, async_op=False):
        shapes = {tuple(t.shape) for t in list(output_tensor_list) + list(input_tensor_list)}
        if len(shapes) <= 1:
            return dist.all_to_all(output_tensor_list, input_tensor_list, group=group, async_op=async_op)
        row = tuple(input_tensor_list[0].shape[1:])
        inp = torch.cat([t.reshape((-1,) + row) for t in input_tensor_list])
        out = inp.new_empty((sum(t.shape[0] for t in output_tensor_list),) + row)
        saved = REC.via
        REC.via = "dist.all_to_all (uneven: all_to_all_single)"
        try:
            dist.all_to_all_single(out, inp, [t.shape[0] for t in output_tensor_list],
                                   [t.shape[0] for t in input_tensor_list], group=group)
        finally:
            REC.via = saved
        for t, c in zip(output_tensor_list, torch.split(out, [t.shape[0] for t in output_tensor_list])):
            t.copy_(c.reshape(t.shape))
        return None


def install_labels():
    """Which FSDP param group is at work, and which torch.distributed call
    issued a c10d op (labels only: the ops are recorded at the dispatcher)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as G

    def unit_name(self):
        mesh = self.mesh_info.mesh
        dims = mesh.mesh_dim_names or ("?",)
        return "%s [%s]" % (self._module_fqn or "root", ",".join(dims))

    def wrap_group(meth, label):
        orig = getattr(G.FSDPParamGroup, meth)

        def hooked(self, *a, **k):
            saved = REC.fsdp
            REC.fsdp = "%s %s" % (unit_name(self), label)
            try:
                return orig(self, *a, **k)
            finally:
                REC.fsdp = saved
        setattr(G.FSDPParamGroup, meth, hooked)

    wrap_group("unshard", "unshard")
    wrap_group("post_backward", "post_backward")

    def wrap_dist(name):
        orig = getattr(dist, name, None)
        if orig is None:
            return

        def hooked(*a, **k):
            saved = REC.via
            REC.via = REC.via or "dist." + name
            try:
                return orig(*a, **k)
            finally:
                REC.via = saved
        setattr(dist, name, hooked)
        import torch.distributed.distributed_c10d as c10d
        if getattr(c10d, name, None) is orig:
            setattr(c10d, name, hooked)

    for n in ("all_to_all", "all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce",
              "all_gather_single", "reduce_scatter_single", "_all_gather_base", "_reduce_scatter_base",
              "all_gather", "broadcast", "barrier"):
        wrap_dist(n)


# --------------------------------------------------------- gradient pattern

class GradPattern:
    """commplan's --pattern oracle gradients (runtime/check.c cp_pattern_grad)
    put into torchtitan's real step: each FSDP parameter's unsharded gradient,
    as FSDP2's post-backward takes it to reduce
    (FSDPParamGroup._get_unsharded_grad_to_reduce, torch 2.15), is overwritten
    in place with ((e + k) % 5 + 1) * (rank + 1) * (micro + 1): k commplan's
    id of the parameter (100 * its unit's index in the plan + its index in
    the unit, from the case's plan.json), e the element's flat index in the
    full parameter (an expert weight's unsharded tensor is the rank's ep
    slice: its rows sit where the rank's ep coordinate puts them), rank the
    global rank, micro 0. Everything after it is torchtitan's and FSDP2's
    own: which group reduces which parameter, the reduce op and divide factor,
    the shard placement (Shard(0), Shard(1)) and the copy into the sharded
    gradient; the reduced shards are then comparable element for element with
    commplan's --simulate --pattern oracle --dump of the same plan."""

    def __init__(self):
        self.k = None       # name -> commplan's parameter id; None: no injection
        self.names = {}     # id(FSDP's sharded parameter) -> its name
        self.rank = 0
        self.micro = 0
        self.injected = {}  # name -> how many times its unsharded gradient was overwritten


GP = GradPattern()


def plan_param_ids(path):
    """commplan's parameter ids (cp_pattern_param_id) by name, from plan.json."""
    with open(path) as f:
        plan = json.load(f)
    return {q["name"]: 100 * u["index"] + j for u in plan["units"] for j, q in enumerate(u["params"])}


def unsharded_full_index(fsdp_param, ushape):
    """The full parameter's flat index of every element of the unsharded
    parameter (ushape): the sharded DTensor's global shape, and on every mesh
    dim that is not FSDP's own (ep for an expert weight) a Shard(d) puts the
    unsharded tensor at coordinate * ushape[d] along d."""
    sp = fsdp_param.sharded_param
    full = list(sp.shape)
    offs = [0] * len(full)
    fsdp_dims = set(fsdp_param.mesh_info.mesh.mesh_dim_names or ())
    mesh = getattr(sp, "device_mesh", None)
    if mesh is not None:
        for i, (dim, pl) in enumerate(zip(mesh.mesh_dim_names or (), sp.placements)):
            if dim in fsdp_dims or not pl.is_shard():
                continue
            if type(pl).__name__ != "Shard":
                raise AssertionError("%s: %r on mesh dim %s" % (GP.names.get(id(sp)), pl, dim))
            offs[pl.dim] += mesh.get_local_rank(i) * ushape[pl.dim]
    numel = 1
    for d in full:
        numel *= d
    idx = torch.arange(numel).view(full)
    for d, (o, n) in enumerate(zip(offs, ushape)):
        idx = idx.narrow(d, o, n)
    return idx


def install_grad_pattern():
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as G
    orig = G.FSDPParamGroup._get_unsharded_grad_to_reduce

    def hooked(self, param):
        g = orig(self, param)
        if g is not None and GP.k is not None:
            name = GP.names.get(id(param.sharded_param), "?")
            if name not in GP.k:
                raise KeyError("torchtitan's parameter %s is not in commplan's plan" % name)
            idx = unsharded_full_index(param, tuple(g.shape))
            with torch.no_grad():
                g.copy_((((idx + GP.k[name]) % 5 + 1) * (GP.rank + 1) * (GP.micro + 1)).to(torch.float32))
            GP.injected[name] = GP.injected.get(name, 0) + 1
        return g
    G.FSDPParamGroup._get_unsharded_grad_to_reduce = hooked


# -------------------------------------------------------------------- model

def titan_gqa_moe_config(m, fam):
    """torchtitan's Qwen3 MoE decoder from its own layer builder (_build_qwen3_moe_layers, as
    tests/titan/test_moe_plan.py builds it); commplan's mixtral is it without the q/k norms."""
    import torchtitan.models.qwen3 as Q
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    hd, d, v = m["head_dim"], m["dim"], m["vocab_size"]
    layers = Q._build_qwen3_moe_layers(
        fuse_qkv=True, n_layers=m["n_layers"], dim=d, n_heads=m["n_heads"], n_kv_heads=m["n_kv_heads"], head_dim=hd,
        moe_hidden_dim=m["moe_hidden_dim"], num_experts=m["num_experts"], top_k=m["top_k"], attn_backend="flex",
        moe_comm_backend="standard", rope=CosSinRoPE.Config(dim=hd, max_seq_len=64, theta=1000000.0))
    if fam == "mixtral":
        for lc in layers:
            lc.attention.qk_norm = None
    return Q.Qwen3Model.Config(
        vocab_size=v, dim=d, norm=Q._qwen3_norm(d),
        tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=d, param_init=Q._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=d, out_features=v, param_init=Q._LINEAR_INIT), layers=layers)


def titan_model_config(m):
    import torchtitan.models.deepseek_v3 as DS
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    layers = DS._build_dsv3_layers(
        n_layers=m["n_layers"], n_dense_layers=m["n_dense_layers"], dim=m["dim"], n_heads=m["n_heads"],
        q_lora_rank=m["q_lora_rank"], kv_lora_rank=m["kv_lora_rank"], qk_nope_head_dim=m["qk_nope_head_dim"],
        qk_rope_head_dim=m["qk_rope_head_dim"], v_head_dim=m["v_head_dim"], mscale=0.70,
        dense_hidden_dim=m["dense_hidden_dim"], moe_hidden_dim=m["moe_hidden_dim"], num_experts=m["num_experts"],
        num_shared_experts=m["num_shared_experts"], router_top_k=m["top_k"], router_score_func="softmax",
        attn_backend="flex", moe_comm_backend="standard", non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=m["qk_rope_head_dim"], max_seq_len=64, theta=10000.0, scaling="none"))
    d, v = m["dim"], m["vocab_size"]
    return DS.DeepSeekV3Model.Config(
        vocab_size=v, dim=d,
        tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=d, param_init=DS._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=d, param_init=DS._NORM_INIT),
        lm_head=Linear.Config(in_features=d, out_features=v, param_init=DS._output_linear_init(d)),
        layers=layers,
        # DeepSeek-V3's multi-token prediction (a case's num_mtp_layers): torchtitan's own builder, each MTP block
        # a copy of the last block's config (models/deepseek_v3/__init__.py:291-316)
        mtp_layers=DS._build_mtp_layers(layers[-1], dim=d, num_mtp_layers=m["num_mtp_layers"])
        if m.get("num_mtp_layers") else [])


def titan_gpt_oss_config(m, max_seq_len=64):
    """torchtitan's gpt-oss decoder from its own builders (_build_gptoss_layers, each block's attention from
    _make_gptoss_attn_config with the case's heads: the builder fixes 64 heads of 64), tiny (its RoPE cache
    max_seq_len positions: tests/titan/test_cp_record.py's 512-token sequences take a longer one)."""
    import torchtitan.models.gpt_oss as G
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear, RMSNorm
    hd, d, v = m["head_dim"], m["dim"], m["vocab_size"]
    rope = CosSinRoPE.Config(dim=hd, max_seq_len=max_seq_len, theta=150000.0)
    layers = G._build_gptoss_layers(
        dim=d, n_layers=m["n_layers"], hidden_dim=m["moe_hidden_dim"], num_experts=m["num_experts"],
        top_k=m["top_k"], load_balance_coeff=1e-3, attn_backend="flex", fuse_qkv=True, moe_comm_backend="standard",
        rope=rope)
    for i, lc in enumerate(layers):
        lc.attention = G._make_gptoss_attn_config(
            dim=d, layer_id=i, attn_backend="flex", n_heads=m["n_heads"], n_kv_heads=m["n_kv_heads"], head_dim=hd,
            sliding_window_size=lc.attention.sliding_window_size, fuse_qkv=True, rope=rope)
    return G.GptOssModel.Config(
        vocab_size=v, dim=d,
        tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=d, param_init=G._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=d, param_init=G._NORM_INIT),
        lm_head=Linear.Config(in_features=d, out_features=v, param_init=G._output_linear_init(d)), layers=layers)


def flex_with_lse_on_cpu():
    """gpt-oss's sinks rescale flex's output by its logsumexp (out_transform, models/gpt_oss/model.py:
    109-131); titan_env's CPU stand-in for FlexAttention (causal SDPA) returns no lse. This one computes
    the causal attention and its lse in eager ops when an out_transform is asked for (the sinks then get
    their gradient, as on GPU), and is the plain stand-in otherwise. No data moves: the maths only."""
    from torchtitan.models.common.attention import FlexAttention
    plain = FlexAttention.forward

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *args, scale=None, enable_gqa=False, out_transform=None, **kwargs):
        if out_transform is None:
            return plain(self, q_BLNH, k_BLNH, v_BLNH, *args, scale=scale, enable_gqa=enable_gqa, **kwargs)
        q, k, v = q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2)
        if enable_gqa and k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = (q @ k.transpose(-1, -2)).float() * (scale if scale is not None else q.shape[-1] ** -0.5)
        L = s.shape[-1]
        s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
        lse = torch.logsumexp(s, -1)
        out = (torch.softmax(s, -1).to(v.dtype) @ v).transpose(1, 2)
        return out_transform(out, lse.transpose(1, 2))
    FlexAttention.forward = forward


def ac_config(mode):
    """torchtitan's own activation checkpointing config (the Trainer's --activation_checkpoint: its
    SelectiveAC / FullAC with their defaults), or None; parallelize_deepseekv3 applies it
    (ac_config.build(...).apply(model): every transformer block wrapped) before fully_shard."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    return {"none": None, "full": FullAC.Config(), "selective": SelectiveAC.Config()}[mode]


def build(case, pd, parallelism, training):
    from torchtitan.config import CompileConfig, DebugConfig
    from torchtitan.trainer import Trainer
    fam = family(case)
    if fam == "deepseek_v3":
        from torchtitan.models.deepseek_v3 import model_registry, parallelize_deepseekv3 as parallelize
        cfg = titan_model_config(model_of(case))
        spec = model_registry("debugmodel")
    elif fam == "gpt_oss":
        from torchtitan.models.gpt_oss import model_registry, parallelize_gptoss as parallelize
        cfg = titan_gpt_oss_config(model_of(case))
        spec = model_registry("debugmodel", attn_backend="flex")
    else:
        from torchtitan.models.qwen3 import model_registry, parallelize_qwen3 as parallelize
        cfg = titan_gqa_moe_config(model_of(case), fam)
        spec = model_registry("debugmodel_moe")
    spec.model = cfg
    # --debug.moe_force_load_balance: torchtitan's round-robin routing (update_from_config sets every router's
    # _debug_force_load_balance from it): the fixed, known routing
    cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training,
                                                 debug=DebugConfig(moe_force_load_balance=True)))
    with torch.device("meta"):
        model = cfg.build()
    model = parallelize(model, parallel_dims=pd, training=training, parallelism=parallelism,
                        compile_config=CompileConfig(), ac_config=ac_config(case.get("ac", "none")),
                        dump_folder=os.path.join(ROOT, "build", "ep", "dump"))
    model.to_empty(device="cpu")
    torch.manual_seed(1234)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    model.train()
    from torch.distributed.fsdp import FSDPModule
    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            mod.set_force_sum_reduction_for_comms(True)  # gloo: no PREMUL_SUM / AVG
    return model


def group_names(pd, world):
    names = {}
    for dim in ("dp_shard", "ep", "efsdp", "dp_replicate", "tp", "cp"):
        try:
            mesh = pd.get_optional_mesh(dim)
        except Exception:  # noqa: BLE001 - a dim this ParallelDims does not name
            mesh = None
        if mesh is None:
            continue
        try:
            ranks = tuple(int(r) for r in dist.get_process_group_ranks(mesh.get_group()))
        except Exception:  # noqa: BLE001
            continue
        if dim not in names.get(ranks, "").split("="):
            names[ranks] = (names[ranks] + "=" + dim) if ranks in names else dim
    names.setdefault(tuple(range(world)), "world")
    return names


def placements(p):
    from torch.distributed.tensor import DTensor
    if isinstance(p, DTensor):
        mesh = p.device_mesh
        return [[n, repr(pl)] for n, pl in zip(mesh.mesh_dim_names or (), p.placements)], list(p.to_local().shape)
    return [], list(p.shape)


def named_parameters(model):
    """The model's parameters by their names without checkpoint_wrapper's prefix (as torchtitan's
    checkpoints name them): layers.1.moe..., not layers.1._checkpoint_wrapped_module.moe..."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
    for n, p in model.named_parameters():
        yield n.replace(_CHECKPOINT_PREFIX, ""), p


MESHES = {}  # mesh_key -> the ParallelDims built for it in this process


def mesh_key(case):
    return (case["world"], case["dp_shard"], case.get("tp", 1), case["ep"])


def recompute_mark(lname, enter):
    """Labels the recompute: a checkpointed block's forward run while autograd's engine runs."""
    def pre(mod, args):
        if torch._C._current_graph_task_id() != -1:
            REC.recompute = lname

    def post(mod, args, out):
        REC.recompute = ""
    return pre if enter else post


def run_case(rank, name, case, plan_json=None):
    import spmd_types as spmd
    from torch.distributed._tools.mod_tracker import ModTracker
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types
    from torchtitan.distributed.utils import get_spmd_context, set_spmd_backend

    parallelism = ParallelismConfig(data_parallel_shard_degree=case["dp_shard"], expert_parallel_degree=case["ep"],
                                    tensor_parallel_degree=case.get("tp", 1),
                                    enable_sequence_parallel=case.get("sp", True))
    set_spmd_backend(parallelism.spmd_backend)  # as Trainer.__init__ does
    training = TrainingConfig(local_batch_size=case["batch"], seq_len=case["seq"], dtype="float32",
                              mixed_precision_param={"bf16": "bfloat16"}.get(case.get("param_dtype"), "float32"),
                              mixed_precision_reduce="float32",
                              disable_cuda_graphs=True)  # CUDA graphs refuse the CPU-syncing all-to-all dispatcher
    key = mesh_key(case)
    if key not in MESHES:   # cases of one mesh share its ParallelDims (see main)
        MESHES[key] = ParallelDims.from_config(parallelism, case["world"])
        MESHES[key].build_mesh()
    pd = MESHES[key]
    model = build(case, pd, parallelism, training)
    REC.group_names = group_names(pd, case["world"])
    GP.k = plan_param_ids(plan_json) if plan_json else None
    GP.names = {id(p): n for n, p in named_parameters(model)}
    GP.rank, GP.micro, GP.injected = rank, 0, {}
    m = model_of(case)
    B, L = case["batch"], case["seq"]
    tokens = torch.randint(0, m["vocab_size"], (B, L + 1), generator=torch.Generator().manual_seed(100 + rank))
    inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    positions = torch.arange(L).repeat(B, 1)
    extra = {"positions": positions, "attention_masks": model.get_attention_masks(positions=positions)}
    if pd.spmd_backend == "spmd_types":
        inputs, labels, extra = annotate_input_spmd_types(pd, inputs, labels, extra)
    routing = {}

    def tap(lname):
        def pre(mod, args):
            counts = args[3]
            counts = counts.to_local() if hasattr(counts, "to_local") else counts
            routing[lname] = {"tokens_per_expert": [int(x) for x in counts.tolist()]}
        return pre

    # (DeepSeek-V3's multi-token prediction blocks, mtp_layers.<k>, labelled by their own names)
    mtp = [("mtp_layers." + str(k), b) for k, b in enumerate(getattr(model, "mtp_layers", None) or [])]
    for lname, layer in [("layers." + n, b) for n, b in model.layers.items()] + mtp:
        if getattr(layer, "moe", None) is not None:
            layer.moe.routed_experts.token_dispatcher._ep_layer = lname
            layer.moe.routed_experts.register_forward_pre_hook(tap(lname[len("layers."):] if lname[0] == "l"
                                                                   else lname))
    for lname, layer in model.layers.items():
        inner = getattr(layer, "_checkpoint_wrapped_module", None)
        if inner is not None:   # activation checkpointing: its forward run in backward is the recompute
            inner.register_forward_pre_hook(recompute_mark("layers." + lname, True))
            inner.register_forward_hook(recompute_mark("layers." + lname, False))
    tracker = ModTracker()
    REC.events = []
    t0 = time.time()
    try:
        with get_spmd_context(parallel_dims=pd)(), tracker, make_mode():
            REC.tracker = tracker
            pred = model(inputs, **extra)
            if m.get("num_mtp_layers"):
                # torchtitan's MTPLoss (models/deepseek_v3/mtp.py:324-): the main logits' loss and one per depth,
                # each loss parallel, given the positions as Trainer._forward_backward_body does
                from torchtitan.models.deepseek_v3.mtp import MTPLoss
                loss = MTPLoss(MTPLoss.Config(global_vocab_size=m["vocab_size"]))(
                    pred, labels, positions=extra["positions"])[0]
            else:
                loss = cross_entropy_loss(pred, labels, global_vocab_size=m["vocab_size"])
            with spmd.no_typecheck():
                loss.backward()
    finally:
        events, REC.events, REC.tracker = REC.events, None, None
        pattern, GP.k = GP.k, None
    out = {"rank": rank, "seconds": round(time.time() - t0, 3), "events": events, "routing": routing,
           "loss": float(loss.detach().to_local() if hasattr(loss, "to_local") else loss.detach())}
    params, grads = [], {}
    for pname, p in named_parameters(model):
        pl, local = placements(p)
        params.append({"name": pname, "shape": list(p.shape), "local": local, "placements": pl,
                       "dtype": str(p.dtype).replace("torch.", "")})
        if p.grad is not None:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grads[pname] = float(g.double().sum())
    out["params"], out["grads"] = params, grads
    if pattern is not None:
        # every parameter's unsharded gradient overwritten once (none skipped by FSDP2 for want of a
        # gradient), then its reduced local shard, element for element
        if sorted(GP.injected) != sorted(pattern) or any(n != 1 for n in GP.injected.values()):
            raise AssertionError("gradient pattern: overwritten %s, commplan's parameters %s" % (
                GP.injected, sorted(pattern)))
        out["grad_pattern"] = {"pattern": "oracle", "micro": 0, "ids": pattern}
        out["grads_local"] = {}
        for pname, p in named_parameters(model):
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            out["grads_local"][pname] = {"shape": list(g.shape), "values": g.detach().reshape(-1).double().tolist()}
    meshes = {}
    for dim in ("dp_shard", "ep", "efsdp", "tp"):
        mesh = pd.get_optional_mesh(dim)
        if mesh is not None:
            meshes[dim] = [int(r) for r in dist.get_process_group_ranks(mesh.get_group())]
    out["groups"] = meshes
    out["efsdp"] = pd.dp_shard * pd.cp * pd.tp // pd.ep if pd.ep > 1 else None
    return out


def worker(rank, world, port, names, tmpdir, plans=None):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import logging
    import warnings
    warnings.filterwarnings("ignore")  # CPU autocast, DTensor RNG on CPU, FlexAttention replaced: known, noise here
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    import titan_env as E
    E.cpu_training()
    flex_with_lse_on_cpu()
    install_labels()
    install_ep_labels()
    install_grad_pattern()
    import spmd_types._dist
    spmd_types._dist.set_dist(GlooDist())
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    for name in names:
        dist.barrier()
        try:
            res = run_case(rank, name, CASES[name], os.path.join(plans, name, "plan.json") if plans else None)
        except Exception as e:  # noqa: BLE001 - recorded, the wrapper reports it
            res = {"rank": rank, "failed": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()}
        with open(os.path.join(tmpdir, "%s-r%d.json" % (name, rank)), "w") as f:
            json.dump(res, f)
        if "failed" in res:
            break
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "build", "ep", "live"))
    ap.add_argument("--cases", default=DEFAULT)
    ap.add_argument("--plans", help="DIR/<case>/plan.json: commplan's plan of each case (its parameter ids); "
                    "with it every unsharded gradient is commplan's oracle pattern and the reduced shards are "
                    "recorded (grads_local)")
    a = ap.parse_args()
    names = names_of(a.cases)
    plans = os.path.abspath(a.plans) if a.plans else None
    for n in names if plans else ():
        if not os.path.isfile(os.path.join(plans, n, "plan.json")):
            sys.exit("ep-run: --plans %s has no %s/plan.json" % (a.plans, n))
    os.makedirs(a.out_dir, exist_ok=True)
    tmproot = os.path.join(ROOT, "build", "ep", "tmp")
    os.makedirs(tmproot, exist_ok=True)
    from importlib.metadata import version
    rc = 0
    with tempfile.TemporaryDirectory(dir=tmproot) as tmp:
        t0 = time.time()
        crashed = None
        # torch and torchtitan are imported once, here; the ranks are forked from this process
        # (spawning imports them again in each rank: ~25 s on a 2-core machine). EP_START=spawn.
        import titan_env  # noqa: F401
        import torchtitan.trainer  # noqa: F401
        import torchtitan.components.loss  # noqa: F401
        import torch.distributed._tools.mod_tracker  # noqa: F401
        # One process group per mesh: a second ParallelDims over the same dp_shard mesh in one process
        # hands fully_shard a cached DeviceMesh that is not the parameters' one, so the cases of one
        # mesh (world, dp_shard, ep) run one after the other in one group on one ParallelDims.
        groups = {}
        for name in names:
            c = CASES[name]
            groups.setdefault(mesh_key(c), []).append(name)
        for group in groups.values():
            name = ",".join(group)
            try:
                mp.start_processes(worker, args=(CASES[group[0]]["world"], free_port(), group, tmp, plans),
                                   nprocs=CASES[group[0]]["world"], join=True,
                                   start_method=os.environ.get("EP_START", "fork"))
            except Exception as e:  # noqa: BLE001
                crashed = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1] if str(e).strip() else "")
                sys.stderr.write("ep-run: %s: a rank process failed: %s\n" % (name, crashed))
                rc = 1
        wall = time.time() - t0
        for name in names:
            case = CASES[name]
            parts = []
            for r in range(case["world"]):
                p = os.path.join(tmp, "%s-r%d.json" % (name, r))
                if os.path.exists(p):
                    with open(p) as f:
                        parts.append(json.load(f))
            if not parts:
                continue
            res = dict(spec(name), efsdp=parts[0].get("efsdp"), torch=torch.__version__,
                       torchtitan=version("torchtitan"), ranks=parts)
            failed = [p for p in parts if "failed" in p]
            if failed:
                res["failed"] = "rank %d: %s" % (failed[0]["rank"], failed[0]["failed"])
                sys.stderr.write("ep-run: %s failed on rank %d:\n%s\n" % (name, failed[0]["rank"],
                                                                        failed[0]["traceback"]))
                rc = 1
            elif len(parts) < case["world"]:
                res["failed"] = "only %d of %d ranks wrote a result%s" % (len(parts), case["world"],
                                                                       " (%s)" % crashed if crashed else "")
                rc = 1
            with open(os.path.join(a.out_dir, name + ".json"), "w") as f:
                json.dump(res, f, indent=1, sort_keys=True)
    print("ep-run: recorded %d cases in %.1f s" % (len(names), wall))
    return rc


if __name__ == "__main__":
    sys.exit(main())
