#!/usr/bin/env python3
"""torch.distributed.pipelining run live on CPU (gloo), recorded (issue 22,
item 6): what each rank really issues in one training step, for
tests/pp/compare_pipeline_live.lua to hold against commplan's derivation
(gen/parallel/pp_sequence.lua).

One launch per mesh (pp outermost, as torchtitan and gen/dims.lua put it:
global rank = (pp_rank * dp_replicate + replica) * dp_shard + dp_rank; with
--dp-replicate > 1, HSDP: fully_shard on the 2-D (dp_replicate, fsdp) mesh);
the processes run every case of
the matrix in turn (schedules x microbatches), each with a fresh model.

Per case, as torchtitan 0.3 builds a pipeline (pipeline_parallel.py,
fsdp.py), on a tiny decoder (tok_embeddings, layers.0..N-1 as Linear+tanh,
norm (RMSNorm), lm_head; torchtitan's module names):
  - the stage split from torchtitan's own _generate_llm_fqn_per_model_part,
    each rank's stages from _get_pp_rank_to_stage_indices_mapping, each
    stage's module from _split_module (deepcopy, other modules removed);
  - with dp_shard (or dp_replicate) > 1, fully_shard as apply_fsdp_to_decoder does under PP:
    tok_embeddings, then [norm, lm_head] as one unit, then every layer
    (reshard_after_forward=False: torchtitan's "default" policy with PP),
    then the stage's root; gradient division off (disable_fsdp_gradient_
    division); PREMUL_SUM/AVG, which gloo lacks, forced to SUM;
  - PipelineStage(chunk, stage, num_stages, cpu, group=the pp group) without
    static shapes (torchtitan's call: the first step infers them);
  - the schedule class by name, n_microbatches, a cross-entropy loss_fn;
    one step(): inputs on the rank with stage 0, targets on the rank with the
    last stage.

Recorded per rank, in issue order, split into phase "init" (the schedule's
_initialize_stage(s): preconnect, shape inference, its FSDP traffic) and
phase "step" (the rest of step()):
  - every point-to-point op: torch.distributed.isend / irecv (what
    _batch_p2p calls for a homogeneous list and batch_isend_irecv for a mixed
    one) and send / recv, with peer global rank, numel, dtype, and the batch
    it belongs to when issued through batch_isend_irecv;
  - every collective (all_gather_single / all_gather_into_tensor /
    reduce_scatter_single / reduce_scatter_tensor / all_reduce / broadcast /
    barrier and the _base forms): the group's global ranks, input and output
    numel, dtype;
  - the action running when it was issued: _PipelineScheduleRuntime's own
    "running time_step %d, action %s" debug record (schedules.py) for the
    multi-stage schedules; for GPipe and 1F1B, the stage's forward_one_chunk /
    backward_one_chunk / perform_reduce_grad in progress (named as torch's
    actions: 0F3, 1B2, 0REDUCE_GRAD; "" before the first).

Output: one JSON per case, build/pp/live/<Schedule>-pp<P>-dp<D>-mb<N>.json.

Usage: torch_pipeline_record.py --pp 2 --dp-shard 1 [--dp-replicate R] [--microbatches 4,8]
       [--schedules GPipe,1F1B,...] [--out-dir build/pp/live]
       [--max-active-stages K]  (multi-stage schedules; torch's default 3)
       [--then --pp 4 ...]      (more meshes, one after the other, in this process)
The rank processes are forked from this one, which has imported torch
(spawning imported it again in every rank: ~3x the CPU of a run on a 2-core
machine); PP_START=spawn spawns them instead.
Exit 77 when torch.distributed.pipelining cannot be imported.
"""
import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import torch.multiprocessing as mp
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S
except ImportError as e:  # pragma: no cover - the check script exits 77 first
    print("SKIP pp-run: torch.distributed.pipelining does not import: %s" % e)
    sys.exit(77)

SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
             "DualPipeV"]
SINGLE = {"GPipe", "1F1B"}
# The tiny decoder. vocab 37 over dp_shard 2 gives uneven dim-0 chunks (FSDP pads).
MODEL = {"n_layers": 6, "dim": 12, "vocab": 37, "seq": 6, "batch": 8}


# ------------------------------------------------------------------ recording

class Recorder:
    def __init__(self):
        self.events = None   # list while recording
        self.phase = "step"
        self.action = ""
        self.batch = None    # batch id while inside batch_isend_irecv
        self.batches = 0
        self.depth = 0       # nested c10d calls (a collective calling another) record once

    def add(self, ev):
        if self.events is None or self.depth > 1:
            return
        ev["phase"] = self.phase
        ev["action"] = self.action
        self.events.append(ev)


REC = Recorder()


def _global_ranks(group):
    if group is None:
        group = c10d._get_default_group()
    return [int(r) for r in dist.get_process_group_ranks(group)]


def _find_group(args, kwargs):
    g = kwargs.get("group")
    if g is None:
        for a in args:
            if isinstance(a, dist.ProcessGroup):
                return a
    return g


def _p2p_wrapper(fn, kind, blocking):
    peer_kw = "group_dst" if kind == "send" else "group_src"
    glob_kw = "dst" if kind == "send" else "src"

    def hooked(tensor, *args, **kwargs):
        REC.depth += 1
        try:
            if REC.depth == 1 and REC.events is not None:
                group = kwargs.get("group", args[1] if len(args) > 1 else None)
                peer = kwargs.get(glob_kw, args[0] if args else None)
                if peer is None and kwargs.get(peer_kw) is not None:
                    peer = dist.get_global_rank(group if group is not None else c10d._get_default_group(),
                                                kwargs[peer_kw])
                REC.add({"op": kind, "peer": int(peer) if peer is not None else None, "numel": tensor.numel(),
                         "dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape),
                         "batch": REC.batch, "blocking": blocking})
            return fn(tensor, *args, **kwargs)
        finally:
            REC.depth -= 1

    hooked._pp_record = fn
    return hooked


def _coll_wrapper(fn, kind):
    def hooked(*args, **kwargs):
        REC.depth += 1
        try:
            if REC.depth == 1 and REC.events is not None:
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                for k in ("output_tensor", "input_tensor", "output", "input", "tensor"):
                    if isinstance(kwargs.get(k), torch.Tensor):
                        tensors.append(kwargs[k])
                ev = {"op": kind, "ranks": _global_ranks(_find_group(args, kwargs))}
                if kind in ("all_gather", "reduce_scatter") and len(tensors) >= 2:
                    out, inp = tensors[0], tensors[1]
                    ev.update({"in_numel": inp.numel(), "out_numel": out.numel(),
                               "dtype": str(inp.dtype).replace("torch.", "")})
                elif tensors:
                    ev.update({"in_numel": tensors[0].numel(), "out_numel": tensors[0].numel(),
                               "dtype": str(tensors[0].dtype).replace("torch.", "")})
                REC.add(ev)
            return fn(*args, **kwargs)
        finally:
            REC.depth -= 1

    hooked._pp_record = fn
    return hooked


def _batch_wrapper(fn):
    def hooked(p2p_op_list):
        REC.batches += 1
        REC.batch, saved = REC.batches, REC.batch
        try:
            return fn(p2p_op_list)
        finally:
            REC.batch = saved

    hooked._pp_record = fn
    return hooked


def install_hooks():
    """Patch torch.distributed (and distributed_c10d, whose P2POp checks its
    op against the module's own isend / irecv: the same wrapper in both)."""
    p2p = {"isend": ("send", False), "irecv": ("recv", False), "send": ("send", True), "recv": ("recv", True)}
    for name, (kind, blocking) in p2p.items():
        fn = getattr(c10d, name)
        if not hasattr(fn, "_pp_record"):
            w = _p2p_wrapper(fn, kind, blocking)
            setattr(c10d, name, w)
            setattr(dist, name, w)
    colls = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
             "_all_gather_base": "all_gather", "reduce_scatter_single": "reduce_scatter",
             "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
             "all_reduce": "all_reduce", "broadcast": "broadcast", "barrier": "barrier", "all_gather": "all_gather",
             "all_gather_object": "all_gather_object", "broadcast_object_list": "broadcast_object_list"}
    for name, kind in colls.items():
        fn = getattr(c10d, name, None)
        if fn is not None and not hasattr(fn, "_pp_record"):
            w = _coll_wrapper(fn, kind)
            setattr(c10d, name, w)
            if getattr(dist, name, None) is fn:
                setattr(dist, name, w)
    fn = c10d.batch_isend_irecv
    if not hasattr(fn, "_pp_record"):
        w = _batch_wrapper(fn)
        c10d.batch_isend_irecv = w
        dist.batch_isend_irecv = w

    # _PipelineScheduleRuntime logs every action before running it.
    class ActionTap(logging.Handler):
        def emit(self, record):
            if record.msg == "_PipelineScheduleRuntime running time_step %d, action %s" and record.args:
                REC.action = str(record.args[1])

    lg = logging.getLogger(S.__name__)
    lg.addHandler(ActionTap(level=logging.DEBUG))
    lg.setLevel(logging.DEBUG)
    lg.propagate = False


def tap_single_stage(stage):
    """GPipe / 1F1B: the stage method in progress names the action."""
    idx = stage.stage_index

    def wrap(name, label):
        orig = getattr(stage, name)

        def hooked(*args, **kwargs):
            REC.action = label(args, kwargs)
            return orig(*args, **kwargs)

        setattr(stage, name, hooked)

    wrap("forward_one_chunk", lambda a, k: "%dF%d" % (idx, a[0]))
    wrap("backward_one_chunk", lambda a, k: "%d%s%d" % (idx, "B" if k.get("full_backward", True) else "I", a[0]))
    wrap("perform_reduce_grad", lambda a, k: "%dREDUCE_GRAD" % idx)


def tap_init(schedule):
    """Phase "init" while the schedule initializes its stages."""
    for name in ("_initialize_stage", "_initialize_stages"):
        orig = getattr(schedule, name, None)
        if orig is None:
            continue

        def hooked(*args, _orig=orig, **kwargs):
            REC.phase = "init"
            try:
                return _orig(*args, **kwargs)
            finally:
                REC.phase = "step"
                REC.action = ""

        setattr(schedule, name, hooked)


# -------------------------------------------------------------------- model

class Decoder(nn.Module):
    """torchtitan's decoder shape, tiny: its forward tolerates the modules
    _split_module removed (None, or layers missing from the ModuleDict)."""

    def __init__(self, n_layers, dim, vocab):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): nn.Linear(dim, dim) for i in range(n_layers)})
        self.norm = nn.RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = torch.tanh(layer(h))
        h = self.norm(h) if self.norm is not None else h
        return self.lm_head(h) if self.lm_head is not None else h


def loss_fn(pred, target):
    return nn.functional.cross_entropy(pred.flatten(0, 1).float(), target.flatten(0, 1))


def apply_fsdp(chunk, mesh, raf=False):
    """torchtitan's apply_fsdp_to_decoder for a stage under PP (dense, no
    weight tying): reshard_after_forward = not pp_enabled = False (its
    "default" policy); raf: its "always" policy, True on every unit,
    [norm, lm_head] too (distributed/fsdp.py:54-77, 183-204); the root
    FSDP2's own (no reshard after forward)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                     cast_forward_inputs=False)
    cfg = {"mesh": mesh, "mp_policy": mp_policy}
    if chunk.tok_embeddings is not None:
        fully_shard(chunk.tok_embeddings, **cfg, reshard_after_forward=raf)
    if chunk.norm is not None and chunk.lm_head is not None:
        fully_shard([chunk.norm, chunk.lm_head], **cfg, reshard_after_forward=raf)
    for block in chunk.layers.values():
        fully_shard(block, **cfg, reshard_after_forward=raf)
    fully_shard(chunk, **cfg)
    for m in chunk.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)      # disable_fsdp_gradient_division
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM / AVG
    return chunk


# -------------------------------------------------------------------- cases

def split_fns():
    try:
        from torchtitan.distributed import pipeline_parallel as ppl
        return (ppl._generate_llm_fqn_per_model_part, ppl._get_pp_rank_to_stage_indices_mapping,
                ppl._split_module, "torchtitan")
    except Exception:  # noqa: BLE001 - torchtitan missing: the same rules, written out
        return _fqn_per_model_part, _rank_stages, _split_module, "mirror"


def _fqn_per_model_part(n, n_layers, inw=1, outw=1):
    eff = n_layers + inw + outw
    per, extra = eff // n, eff % n
    out, layer = [], 0
    for s in range(n):
        mods, take = [], per + (1 if s < extra else 0)
        if s == 0:
            mods.append("tok_embeddings")
            take -= inw
        elif s == n - 1:
            take -= outw
        for _ in range(take):
            if layer < n_layers:
                mods.append("layers.%d" % layer)
                layer += 1
        if s == n - 1:
            mods += ["norm", "lm_head"]
        out.append(mods)
    return out


def _rank_stages(r, pp, schedule, n):
    if schedule in ("ZBVZeroBubble", "DualPipeV"):
        return (r, n - 1 - r)
    return tuple(r + s * pp for s in range(n // pp))


def _split_module(whole, names):
    import copy
    m = copy.deepcopy(whole)
    keep = set(names)
    layers = {n.split(".", 1)[1] for n in keep if n.startswith("layers.")}
    for k in list(m.layers.keys()):
        if k not in layers:
            del m.layers[k]
    for name in ("tok_embeddings", "norm", "lm_head"):
        if name not in keep:
            setattr(m, name, None)
    return m


def run_case(ctx, schedule_name, n):
    rank, pp, dp, dr = ctx["rank"], ctx["pp"], ctx["dp"], ctx["dr"]
    pp_rank, dp_rank = rank // (dr * dp), rank % dp
    v = 1 if schedule_name in SINGLE else 2
    num_stages = pp * v
    fqn, rank_stages, split_module, split_by = split_fns()
    names = fqn(num_stages, MODEL["n_layers"], 1, 1)
    my_stages = list(rank_stages(pp_rank, pp, schedule_name, num_stages))
    torch.manual_seed(1234)
    whole = Decoder(MODEL["n_layers"], MODEL["dim"], MODEL["vocab"])
    stages = []
    for s in my_stages:
        chunk = split_module(whole, names[s])
        if dr * dp > 1:
            apply_fsdp(chunk, ctx["fsdp_mesh"], ctx["raf"])
        st = PipelineStage(chunk, s, num_stages, torch.device("cpu"), group=ctx["pp_group"])
        if schedule_name in SINGLE:
            tap_single_stage(st)
        stages.append(st)
    out = {"rank": rank, "pp_rank": pp_rank, "dp_rank": dp_rank, "stages": my_stages}
    cls = S.get_schedule_class(schedule_name)
    extra = {} if schedule_name in SINGLE or not ctx["max_active"] else {"max_active_stages": ctx["max_active"]}
    try:
        sched = cls(stages[0] if schedule_name in SINGLE else stages, n_microbatches=n, loss_fn=loss_fn,
                    scale_grads=False, **extra)
    except (ValueError, AssertionError, NotImplementedError) as e:
        out["refused"] = "%s: %s" % (type(e).__name__, e)
        return out, names, split_by
    tap_init(sched)
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, MODEL["vocab"], (MODEL["batch"], MODEL["seq"]), generator=g)
    targets = torch.randint(0, MODEL["vocab"], (MODEL["batch"], MODEL["seq"]), generator=g)
    has_first, has_last = 0 in my_stages, num_stages - 1 in my_stages
    losses = [] if has_last else None
    REC.events, REC.action, REC.phase, REC.batches = [], "", "step", 0
    t0 = time.time()
    try:
        if has_first:
            sched.step(tokens, target=targets if has_last else None, losses=losses)
        elif has_last:
            sched.step(target=targets, losses=losses)
        else:
            sched.step()
    finally:
        events, REC.events = REC.events, None
    out["seconds"] = round(time.time() - t0, 3)
    # the parameters the step left without a (reduced) gradient: none, unless torch dropped a reduction
    out["no_grad"] = sorted(n for st in stages for n, p in st.submod.named_parameters() if p.grad is None)
    out["events"] = events
    if losses:
        out["loss"] = float(sum(float(x.detach()) for x in losses) / len(losses))
    # what the schedule itself says it ran (multi-stage: the lowered lists)
    order = getattr(sched, "pipeline_order_with_comms", None)
    if order is not None:
        out["lowered"] = ["" if a is None else str(a) for a in order[pp_rank]]
    return out, names, split_by


def worker(rank, world, pp, dp, dr, port, cases, tmpdir, max_active, raf=False):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    install_hooks()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world,
                            timeout=timedelta(seconds=90))
    from torch.distributed.device_mesh import init_device_mesh
    if dr > 1:
        # HSDP, as torchtitan meshes it: fully_shard on the 2-D (dp_replicate, fsdp) mesh
        mesh = init_device_mesh("cpu", (pp, dr, dp), mesh_dim_names=("pp", "dp_replicate", "fsdp"))
        fsdp_mesh = mesh["dp_replicate", "fsdp"]
    else:
        mesh = init_device_mesh("cpu", (pp, dp), mesh_dim_names=("pp", "fsdp"))
        fsdp_mesh = mesh["fsdp"]
    ctx = {"rank": rank, "pp": pp, "dp": dp, "dr": dr, "pp_group": mesh.get_group("pp"), "fsdp_mesh": fsdp_mesh,
           "max_active": max_active, "raf": raf}
    for schedule_name, n in cases:
        dist.barrier()
        try:
            res, names, split_by = run_case(ctx, schedule_name, n)
        except Exception as e:  # noqa: BLE001 - recorded, the checker reports it
            res, names, split_by = {"rank": rank, "failed": "%s: %s" % (type(e).__name__, e),
                                    "traceback": traceback.format_exc()}, None, None
        res["split"], res["split_by"] = names, split_by
        with open(os.path.join(tmpdir, "%s-%d-r%d.json" % (schedule_name, n, rank)), "w") as f:
            json.dump(res, f)
        if "failed" in res:
            break  # the other ranks may hang in this case; stop here
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--dp-shard", type=int, default=1)
    ap.add_argument("--dp-replicate", type=int, default=1, help="HSDP's replicas (fully_shard on a 2-D mesh)")
    ap.add_argument("--microbatches", default="4,8")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--out-dir", default="build/pp/live")
    ap.add_argument("--max-active-stages", type=int, default=None,
                    help="the multi-stage schedules' max_active_stages (torch's default 3; torchtitan keeps it)")
    ap.add_argument("--reshard-after-forward", action="store_true",
                    help="torchtitan's fsdp_reshard_after_forward = \"always\" (every unit resharded after forward)")
    # Several meshes in one process (torch imported once): their arguments separated by --then.
    argv, runs = sys.argv[1:], [[]]
    for x in argv:
        if x == "--then":
            runs.append([])
        else:
            runs[-1].append(x)
    for run in runs:
        record(ap.parse_args(run))


def record(a):
    pp, dp, dr = a.pp, a.dp_shard, a.dp_replicate
    world = pp * dr * dp
    cases = [(s, int(n)) for s in a.schedules.split(",") for n in a.microbatches.split(",")]
    os.makedirs(a.out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        crashed = None
        try:
            # forked: torch imported once, here (PP_START=spawn: imported again in every rank)
            mp.start_processes(worker, args=(world, pp, dp, dr, free_port(), cases, tmp, a.max_active_stages,
                                                     a.reshard_after_forward),
                               nprocs=world, join=True, start_method=os.environ.get("PP_START", "fork"))
        except Exception as e:  # noqa: BLE001 - what the ranks wrote is merged; the case says it failed
            crashed = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1] if str(e).strip() else "")
            sys.stderr.write("pp-run: a rank process failed (pp=%d dp_shard=%d): %s\n" % (pp, dp, crashed))
        wall = time.time() - t0
        written = []
        for schedule_name, n in cases:
            parts = []
            for r in range(world):
                p = os.path.join(tmp, "%s-%d-r%d.json" % (schedule_name, n, r))
                if os.path.exists(p):
                    with open(p) as f:
                        parts.append(json.load(f))
            if not parts:
                continue
            case = {"schedule": schedule_name, "pp": pp, "dp_shard": dp, "dp_replicate": dr, "world": world,
                    "microbatches": n,
                    "stages_per_rank": 1 if schedule_name in SINGLE else 2, "model": MODEL,
                    "max_active_stages": a.max_active_stages if schedule_name not in SINGLE else None,
                    "reshard_after_forward": a.reshard_after_forward,
                    "torch": torch.__version__, "split": parts[0].get("split"), "split_by": parts[0].get("split_by"),
                    "ranks": parts}
            refused = {p.get("refused") for p in parts}
            if len(refused) == 1 and None not in refused:
                case["refused"] = refused.pop()
            failed = [p for p in parts if "failed" in p]
            if failed:
                case["failed"] = "rank %d: %s" % (failed[0]["rank"], failed[0]["failed"])
            if len(parts) < world and not failed:
                case["failed"] = "only %d of %d ranks wrote a result%s" % (len(parts), world,
                                                                        " (%s)" % crashed if crashed else "")
            path = os.path.join(a.out_dir, "%s-pp%d-%sdp%d-mb%d%s%s.json" % (
                schedule_name, pp, "dr%d-" % dr if dr > 1 else "", dp, n,
                "-mas%d" % a.max_active_stages if a.max_active_stages else "",
                "-always" if a.reshard_after_forward else ""))
            with open(path, "w") as f:
                json.dump(case, f, indent=1, sort_keys=True)
            written.append(path)
    print("pp-run: recorded %d cases (pp=%d dp_replicate=%d dp_shard=%d, %d ranks) in %.1f s" % (
        len(written), pp, dr, dp, world, wall))


if __name__ == "__main__":
    main()
