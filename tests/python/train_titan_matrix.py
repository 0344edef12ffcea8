"""torchtitan's own training step with commplan's bridge in place of fully_shard, over the
configurations torchtitan trains (issue 36, item 4), on CPU: gloo, torchrun, 4 and 8 ranks.

Each side runs torchtitan 0.3's Trainer.train_step itself (torchtitan/trainer.py:871; the
Trainer object made without its __init__, which needs a tokenizer, a data loader and a GPU, and
given the attributes its step reads): its global-token-count loss normalization (dist_sum_tensor
over the batch mesh), its gradient accumulation loop (forward_backward_step per micro-batch,
post_dataloading_process with its SPMD input annotation and attention masks, _forward_backward_body
under its SPMD context), its loss (config.loss.build: CrossEntropyLoss, or ChunkedLossWrapper with
set_lm_head / _skip_lm_head as Trainer.__init__ does it, trainer.py:513), its clip_grad_norm_
(torchtitan/distributed/utils.py:599, max_norm 0.25 so that every step clips: on the bridge,
torch's get_total_norm made global by commplan.training), its OptimizersContainer (AdamW,
default_adamw) and its LRSchedulersContainer (llama3_debugmodel's), on torchtitan's llama3 (debug-sized: dim 64, 2 layers, vocab 250,
seq 16, batch 2; FlexAttention swapped for causal SDPA on both sides, titan_env.cpu_training).

    side A   torchtitan's own parallelize_llama (fully_shard, TP, apply_ac as the config says)
    side B   the same model and initial values (TP by commplan.tensor_parallel.titan_tp_model,
             torchtitan's AC applied where parallelize_llama applies it), the bridge
             (CommplanFSDP over the plan's host library, HostLibrary, its default overlap) doing
             every FSDP collective and copy from the plan written by plan_from_titan

Every micro-batch's loss, every step's gradient norm and, after every step, every sharded
parameter and its gradient (local shards) are compared bit for bit. Checkpoint round trips
(configs marked ckpt): A saves a DCP checkpoint after step C with torchtitan's own stateful
objects (ModelWrapper, OptimizersContainer's flat FQN-keyed state, the LR schedulers); a fresh
bridge model (other initial values) loads it (commplan.checkpoint) and trains steps C.. N-1; and
the reverse: B's checkpoint (the bridge's DTensor state dict, the container's flat state wrapped
in the parameters' DTensor layout) loaded into a fresh torchtitan + fully_shard model; both must
continue bit-identically to A.

A config is one entry of CONFIGS (mesh, AC mode, loss, ckpt). One torchrun launch per world
size runs all of its configs. A config whose bridge support has not landed (NEEDS / LANDED)
prints a SKIP naming what is missing; it never passes. The matrix: FSDP 4, HSDP 2x2, FSDP 2 x
TP 2, HSDP 2x2 x TP 2 (8 ranks), each with no AC and the whole-logits loss (DCP round trips) and
with selective and full AC under ChunkedLossWrapper (round trips under selective), and AC on the
whole-logits loss (HSDP selective with round trips, FSDP x TP full). A mutant whose clipping takes
the local norm (commplan.training unregistered) differs in every parameter after step 0.

    tests/python/train_titan_matrix.py [TORCHRUN] [--tier quick|full] [--configs a,b]

Closing line: "train_titan_matrix: N passed, M failed, K skipped (...counts...)". Exit 0 when
nothing failed, 1 otherwise, 77 when torch / torchtitan / torchrun are missing (one SKIP line).
"""
import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "titan"))

import bridge_harness as H  # noqa: E402

TAG = "train_titan_matrix"

TITAN = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=250, multiple_of=16, ffn_dim_multiplier=1.3)
SEQ, BATCH, MICRO = 16, 2, 2
LOSS_CHUNKS = 8  # ChunkedLossWrapper's default num_chunks (components/loss.py:611); the plan's training.loss_chunks
MAX_NORM = 0.25  # below the debug model's gradient norms (~0.55), so every step clips
BUILD = os.path.join("build", "titan_matrix")

# The meshes (torchtitan's ParallelismConfig degrees) and their world sizes.
MESHES = {
    "fsdp": dict(dp_shard=4),
    "hsdp": dict(dp_replicate=2, dp_shard=2),
    "fsdp_tp": dict(dp_shard=2, tp=2),
    "hsdp_tp": dict(dp_replicate=2, dp_shard=2, tp=2),
}


def world_of(mesh):
    m = MESHES[mesh]
    return m.get("dp_replicate", 1) * m["dp_shard"] * m.get("tp", 1)


def entry(mesh, ac, loss, ckpt=False):
    return dict(name="%s/%s/%s" % (mesh, ac, loss), mesh=mesh, ac=ac, loss=loss, ckpt=ckpt)


# The matrix. Item 4's: every mesh x {selective, full} AC x ChunkedLossWrapper, clipping on; and
# the baseline that ran first (no AC, CrossEntropyLoss), with the checkpoint round trips.
CONFIGS = [entry(m, "none", "ce", ckpt=True) for m in MESHES]
CONFIGS += [entry(m, ac, "chunked", ckpt=(ac == "selective")) for m in MESHES for ac in ("selective", "full")]
# AC with the whole-logits loss (each AC mode, with and without TP): AC apart from the chunked loss
CONFIGS += [entry("hsdp", "selective", "ce", ckpt=True), entry("fsdp_tp", "full", "ce")]
# make test's quick tier: these configs at QUICK_STEPS steps (checkpoint after step QUICK_STEPS // 2).
QUICK = ["hsdp/selective/chunked"]
QUICK_STEPS, FULL_STEPS = 4, 20

# What each feature of a config needs from the bridge, and whether it has landed.
NEEDS = {
    "tp": "FSDP/HSDP x TP through the bridge (tensor_parallel)",
    "ac": "torchtitan's activation checkpointing (apply_ac) through the bridge",
    "chunked": "ChunkedLossWrapper through the bridge (the plan's training.loss_chunks)",
}
LANDED = {"tp", "ac", "chunked"}


def features(cfg):
    out = []
    if MESHES[cfg["mesh"]].get("tp", 1) > 1:
        out.append("tp")
    if cfg["ac"] != "none":
        out.append("ac")
    if cfg["loss"] == "chunked":
        out.append("chunked")
    return out


def missing(cfg):
    return [NEEDS[f] for f in features(cfg) if f not in LANDED]


def plan_name(cfg):
    return "ttm_" + cfg["name"].replace("/", "_")


# ---- both sides --------------------------------------------------------------------------

def titan_model():
    import titan_env as E
    import test_llama_plan as TL
    E.cpu_training()
    return TL.titan_config(None, TITAN, True)


def titan_configs(cfg, steps):
    """torchtitan's config objects for this entry: (parallelism, training, ac config, loss config,
    optimizer config, lr scheduler config)."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import default_adamw
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    m = MESHES[cfg["mesh"]]
    parallelism = ParallelismConfig(data_parallel_replicate_degree=m.get("dp_replicate", 1),
                                    data_parallel_shard_degree=m["dp_shard"], tensor_parallel_degree=m.get("tp", 1))
    training = TrainingConfig(local_batch_size=BATCH, global_batch_size=BATCH * MICRO * m.get("dp_replicate", 1)
                              * m["dp_shard"], seq_len=SEQ, dtype="float32", mixed_precision_param="float32",
                              mixed_precision_reduce="float32", max_norm=MAX_NORM, steps=steps,
                              disable_cuda_graphs=True)
    ac = {"none": None, "selective": SelectiveAC.Config(), "full": FullAC.Config()}[cfg["ac"]]
    # torchtitan's llama3_debugmodel config (models/llama3/config_registry.py:34): its loss (the
    # global vocabulary for loss_parallel's CE), optimizer and LR schedule; foreach AdamW (fused is CUDA's)
    ce = CrossEntropyLoss.Config(global_vocab_size=TITAN["vocab_size"])
    loss = ce if cfg["loss"] == "ce" else ChunkedLossWrapper.Config(loss_fn=ce, num_chunks=LOSS_CHUNKS)
    optimizer = default_adamw(lr=8e-4)
    optimizer.implementation = "foreach"
    lr = LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8, decay_type="linear", min_lr_factor=0.0)
    return parallelism, training, ac, loss, optimizer, lr


def full_values(seed):
    """The unparallelized model's parameters, initialized by torchtitan's build under seed."""
    import torch
    torch.manual_seed(seed)
    b = titan_model().build()
    return {n: p.detach().clone() for n, p in b.named_parameters()}


def piece(full, mesh, placements):
    """This rank's local tensor of `full` under fully_shard (+ TP)'s placements: the innermost mesh
    dim first, then the outer ones on that piece (what _StridedShard(d, sf=tp) beside tp's Shard(d)
    means, torch/distributed/fsdp/_fully_shard/_fsdp_param.py:640), torch.chunk's pieces
    (distribute_tensor asserts on an uneven _StridedShard)."""
    t = full
    for d in reversed(range(mesh.ndim)):
        p = placements[d]
        if hasattr(p, "dim"):
            chunks = t.chunk(mesh.size(d), p.dim)
            r = mesh.get_local_rank(d)
            t = chunks[r] if r < len(chunks) else t.narrow(p.dim, 0, 0)
    return t


def copy_values(model, full):
    """full's values (by the model's FQNs, checkpoint_wrapper's segment dropped) into model."""
    import torch
    from torch.distributed.tensor import DTensor
    from commplan.recompute import clean_fqn
    with torch.no_grad():
        for n, p in model.named_parameters():
            v = full[clean_fqn(n)]
            p.copy_(v) if not isinstance(p, DTensor) else p.to_local().copy_(piece(v, p.device_mesh, p.placements))


def titan_parallelized(cfg, pd, confs, seed):
    """Side A: torchtitan's parallelize_llama at the config's mesh, AC as configured, FSDP
    reductions as a SUM (torchtitan's divide factor 1 reduces with PREMUL_SUM, which gloo lacks)."""
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.config import CompileConfig
    from torchtitan.models.llama3 import model_registry, parallelize_llama
    from torchtitan.trainer import Trainer
    import torch
    parallelism, training, ac, _, _, _ = confs
    full = full_values(seed)
    spec = model_registry("debugmodel")
    spec.model = titan_model()
    spec.model.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training))
    with torch.device("cpu"):
        model = spec.model.build()
    model = parallelize_llama(model, parallel_dims=pd, training=training, parallelism=parallelism,
                              compile_config=CompileConfig(), ac_config=ac,
                              dump_folder=os.path.join(tempfile.gettempdir(), "titan_matrix_dump"))
    copy_values(model, full)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
    return model


def bridge_model(cfg, pd, confs, seed):
    """Side B: the same model, unparallelized (FSDP is the bridge's), then the bridge over it.
    Returns (model, CommplanFSDP)."""
    from commplan.match import find_plan_json, load_plan_json
    from commplan.runtime import CommplanFSDP, HostLibrary
    from commplan.titan import titan_fsdp_units
    import torch
    full = full_values(seed)
    tp = MESHES[cfg["mesh"]].get("tp", 1)
    if tp > 1:  # torchtitan's TP alone (commplan.tensor_parallel), parameters TP-local plain tensors
        from commplan.tensor_parallel import titan_tp_model
        parallelism, training = confs[0], confs[1]
        model = titan_tp_model(titan_model(), parallelism, training, pd)
        r = pd.get_mesh("tp").get_local_rank()
        with torch.no_grad():
            for n, p in model.named_parameters():
                v = full[n]
                d = next((d for d in range(v.dim()) if v.shape[d] != p.shape[d]), None)
                p.copy_(v if d is None else torch.chunk(v, tp, dim=d)[r])
    else:
        model = titan_model().build()
        copy_values(model, full)
    if confs[2] is not None:  # torchtitan's AC where parallelize_llama applies it: after TP, before FSDP (:58)
        confs[2].build(dump_folder=os.path.join(tempfile.gettempdir(), "titan_matrix_dump")).apply(model)
    name = plan_name(cfg)
    pj = load_plan_json(find_plan_json(name, REPO))
    lib = HostLibrary(os.path.join(REPO, "build", name, "lib%s.so" % name), name, plan_json=pj)
    return model, CommplanFSDP(name, model, titan_fsdp_units(model), root=REPO, library=lib)


class _Stub:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def trainer_for(model, pd, confs, steps):
    """torchtitan's Trainer without __init__, holding what train_step reads (trainer.py:871-990)."""
    import torch
    from torchtitan.components.loss import ChunkedLossWrapper
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.trainer import Trainer
    parallelism, training, _, loss, optimizer, lr = confs
    t = Trainer.__new__(Trainer)
    t.config = Trainer.Config(parallelism=parallelism, training=training, loss=loss, optimizer=optimizer,
                              lr_scheduler=lr)
    t.parallel_dims = pd
    t.device = torch.device("cpu")
    t.model_parts = [model]
    t.model_config = titan_model()
    t.loss_fn = loss.build(compile_config=None)
    if isinstance(t.loss_fn, ChunkedLossWrapper):  # as Trainer.__init__ does (trainer.py:513)
        t.loss_fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
    t.optimizers = optimizer.build(model_parts=t.model_parts)
    t.lr_schedulers = lr.build(optimizers=t.optimizers, training_steps=steps)
    t.gradient_accumulation_steps = MICRO
    t.num_pipeline_parallel_microbatches = 1
    t.metrics_processor = _Stub(should_log=lambda step: False)
    t.checkpointer = _Stub(maybe_wait_for_staging=lambda: None)
    t.train_context = dist_utils.get_spmd_context(parallel_dims=pd)
    t.fwd_bwd_fn = t._forward_backward_body
    t.ntokens_seen = 0
    t.step = 0
    return t


def batches(rank, step, vocab):
    """The micro-batches of one step on this rank, as torchtitan's data loader gives them."""
    import torch
    out = []
    for m in range(MICRO):
        g = torch.Generator().manual_seed(10_000 + 1000 * rank + 10 * step + m)
        t = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g)
        out.append(({"input": t[:, :-1], "positions": torch.arange(SEQ).repeat(BATCH, 1)}, t[:, 1:]))
    return out


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def run_steps(t, model, rank, first, last, rec):
    """Trainer.train_step for steps [first, last); into rec: every micro-batch's loss, the step's
    gradient norm (what torchtitan's clip_grad_norm_ returned), each parameter's local shard and
    its (clipped) gradient after the step."""
    import torchtitan.distributed.utils as dist_utils
    losses, norms = [], []
    body, clip = t._forward_backward_body, dist_utils.clip_grad_norm_

    def fwd_bwd(*a, **kw):
        loss = body(*a, **kw)
        losses.append(local(loss).detach().clone())
        return loss

    def clip_rec(*a, **kw):
        n = clip(*a, **kw)
        norms.append(local(n).detach().clone())
        return n
    t.fwd_bwd_fn = fwd_bwd
    dist_utils.clip_grad_norm_ = clip_rec
    host = []
    try:
        for s in range(first, last):
            t.step = s + 1
            t0 = time.perf_counter()
            t.train_step(iter(batches(rank, s, TITAN["vocab_size"])))
            host.append(time.perf_counter() - t0)
            rec[(s, "loss")] = list(losses)
            rec[(s, "norm")] = norms[-1]
            losses.clear()
            for n, p in model.named_parameters():
                rec[(s, "param", n)] = local(p).detach().clone()
                rec[(s, "grad", n)] = None if p.grad is None else local(p.grad).detach().clone()
    finally:
        dist_utils.clip_grad_norm_ = clip
    return host


def compare(ref, got, steps, what):
    """Differences between two runs' records over the given steps, as lines; (lines, count)."""
    import torch
    bad, n = [], 0
    for key, x in ref.items():
        if key[0] not in steps:
            continue
        y = got.get(key)
        n += len(x) if isinstance(x, list) else 1
        if isinstance(x, list):
            same = y is not None and len(x) == len(y) and all(torch.equal(a, b) for a, b in zip(x, y))
        else:
            same = (x is None) == (y is None) and (x is None or (x.shape == y.shape and torch.equal(x, y)))
        if not same:
            bad.append("%s: step %d %s%s differs" % (what, key[0], key[1], " of " + key[2] if len(key) > 2 else ""))
    return bad, n


# ---- checkpoints -------------------------------------------------------------------------

class _BridgeModel:
    """The bridge's model as a DCP Stateful: fully_shard's DTensor state dict (commplan.checkpoint)."""

    def __init__(self, fsdp):
        self.f = fsdp

    def state_dict(self):
        return self.f.state_dict()

    def load_state_dict(self, sd):
        self.f.load_state_dict(sd)


class _BridgeOptim:
    """torchtitan's OptimizersContainer over the bridge's sharded parameters as a DCP Stateful:
    its flat FQN-keyed state (state.{fqn}.{name}, param_groups.{fqn}.{key};
    torchtitan/components/optimizer/utils.py:71) with each per-element tensor wrapped in its
    parameter's DTensor layout (the bridge's state dict's), as fully_shard's DTensor parameters
    make them; loading unwraps to this rank's shard."""

    def __init__(self, fsdp, opt):
        self.f, self.opt = fsdp, opt

    def state_dict(self):
        from commplan.checkpoint import as_dtensor
        out = {}
        for k, v in self.opt.state_dict().items():
            out[k] = as_dtensor(self.f, k[len("state."):k.rfind(".")], v) if k.startswith("state.") else v
        return out

    def load_state_dict(self, sd):
        self.opt.load_state_dict({k: local(v) for k, v in sd.items()})


def titan_states(t):
    from torchtitan.components.checkpointer.base import ModelWrapper
    return {"model": ModelWrapper(t.model_parts), "optimizer": t.optimizers, "lr_scheduler": t.lr_schedulers}


def bridge_states(t, fsdp):
    return {"model": _BridgeModel(fsdp), "optimizer": _BridgeOptim(fsdp, t.optimizers),
            "lr_scheduler": t.lr_schedulers}


# ---- the ranks ---------------------------------------------------------------------------

def run_config(cfg, steps, rank, tmp):
    """One config on this rank: A, B, and the round trips. Returns a report dict."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    world = world_of(cfg["mesh"])
    confs = titan_configs(cfg, steps)
    pd = H.parallel_dims(confs[0], world)  # one per layout and process: torchtitan reuses the first mesh
    C = steps // 2
    ck_a = os.path.join(tmp, plan_name(cfg) + "_titan")
    ck_b = os.path.join(tmp, plan_name(cfg) + "_bridge")
    rep = dict(cfg=cfg["name"], bad=[], compared=0, host_a=[], host_b=[])
    t0 = time.perf_counter()

    # A: torchtitan + fully_shard (its checkpoint after step C)
    a = titan_parallelized(cfg, pd, confs, 1234)
    ta = trainer_for(a, pd, confs, steps)
    rec_a = {}
    rep["host_a"] += run_steps(ta, a, rank, 0, C, rec_a)
    if cfg["ckpt"]:
        dcp.save(titan_states(ta), checkpoint_id=ck_a)
    rep["host_a"] += run_steps(ta, a, rank, C, steps, rec_a)
    rep["losses"] = [rec_a[(0, "loss")][0].item(), rec_a[(steps - 1, "loss")][-1].item()]
    rep["norms"] = [rec_a[(0, "norm")].item(), rec_a[(steps - 1, "norm")].item()]
    del ta, a

    # B: the bridge (its checkpoint after step C)
    b, fsdp = bridge_model(cfg, pd, confs, 1234)
    tb = trainer_for(b, pd, confs, steps)
    rec_b = {}
    rep["host_b"] += run_steps(tb, b, rank, 0, C, rec_b)
    if cfg["ckpt"]:
        dcp.save(bridge_states(tb, fsdp), checkpoint_id=ck_b)
    rep["host_b"] += run_steps(tb, b, rank, C, steps, rec_b)
    bad, n = compare(rec_a, rec_b, range(steps), "bridge vs torchtitan")
    rep["bad"] += bad
    rep["compared"] += n
    fsdp.close()
    del tb, b, fsdp
    rep["wall_ab"] = time.perf_counter() - t0

    if cfg["ckpt"]:
        # torchtitan's checkpoint into a fresh bridge (other initial values), training continued
        b2, f2 = bridge_model(cfg, pd, confs, 999)
        t2 = trainer_for(b2, pd, confs, steps)
        st = bridge_states(t2, f2)
        dcp.load(st, checkpoint_id=ck_a)
        rec = {}
        run_steps(t2, b2, rank, C, steps, rec)
        bad, n = compare(rec_a, rec, range(C, steps), "torchtitan's checkpoint -> bridge")
        rep["bad"] += bad
        rep["compared"] += n
        f2.close()
        del t2, b2, f2
        # the bridge's checkpoint into a fresh torchtitan + fully_shard model
        a2 = titan_parallelized(cfg, pd, confs, 999)
        t2 = trainer_for(a2, pd, confs, steps)
        dcp.load(titan_states(t2), checkpoint_id=ck_b)
        rec = {}
        run_steps(t2, a2, rank, C, steps, rec)
        bad, n = compare(rec_a, rec, range(C, steps), "bridge's checkpoint -> torchtitan")
        rep["bad"] += bad
        rep["compared"] += n
        del t2, a2
    rep["wall"] = time.perf_counter() - t0
    dist.barrier()
    return rep


def worker(args):
    import titan_env as E
    E.cpu_training()  # before the mesh: torchtitan builds degree-1 dims over the "fake" backend
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if rank == 0:
        print("worker up: %.1f s after torchrun started it" % (time.time() - args.t0), flush=True)
    H.init_rank()
    names = args.configs.split(",")
    by = {c["name"]: c for c in CONFIGS}
    reports = []
    for name in names:
        try:
            reports.append(run_config(by[name], args.steps, rank, args.tmp))
        except Exception as e:  # noqa: BLE001  (a config that raises is a failure of that config, reported)
            import traceback
            traceback.print_exc()
            reports.append(dict(cfg=name, bad=["raised " + H.failure(e)], compared=0, host_a=[], host_b=[]))
    out = H.gather(reports, world)
    if rank == 0:
        import json
        with open(args.result, "w") as f:
            json.dump(out, f)
    return 0


# ---- the launcher ------------------------------------------------------------------------

def build_plan(cfg, steps):
    """The plan written from torchtitan's model by plan_from_titan at the config's mesh, then make
    builds its library."""
    from commplan.titan import plan_from_titan
    name = plan_name(cfg)
    d = os.path.join(REPO, BUILD)
    os.makedirs(d, exist_ok=True)
    par = {k: v for k, v in MESHES[cfg["mesh"]].items()}
    # AC changes no FSDP collective (the plan is the model's without it); the chunked loss's order is
    # the plan's training.loss_chunks
    training = {}
    if cfg["loss"] == "chunked":
        training["loss_chunks"] = LOSS_CHUNKS
    if cfg["ac"] != "none":  # the memory model's (training.activation_checkpointing); no op changes
        training["activation_checkpointing"] = cfg["ac"]
    plan_from_titan(titan_model(), name, world_of(cfg["mesh"]), parallel=par,
                    fsdp={"micro_steps": MICRO, "reduce_op": "sum"}, seq_len=SEQ, training=training or None,
                    out=os.path.join(d, name + ".lua"))
    H.build_all(TAG, BUILD, [name])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("torchrun", nargs="?", help="torch's torchrun (default: beside this python)")
    ap.add_argument("--tier", choices=("quick", "full"), default=None,
                    help="quick: %s at %d steps; full: the whole matrix at %d (default: COMMPLAN_TEST_TIER)"
                    % (", ".join(QUICK), QUICK_STEPS, FULL_STEPS))
    ap.add_argument("--configs", help="comma-separated config names (default: the tier's)")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.exit(worker(args))
    torchrun = H.torchrun_for(TAG, args.torchrun, ("torch", "torch.distributed.fsdp", "torchtitan"),
                              "torch with FSDP2 and torchtitan")
    tier = args.tier or ("full" if os.environ.get("COMMPLAN_TEST_TIER") == "full" else "quick")
    steps = args.steps or (FULL_STEPS if tier == "full" else QUICK_STEPS)
    names = args.configs.split(",") if args.configs else [c["name"] for c in CONFIGS] if tier == "full" else QUICK
    by = {c["name"]: c for c in CONFIGS}
    for n in names:
        if n not in by:
            sys.exit("train_titan_matrix: unknown config %r; known: %s" % (n, ", ".join(by)))
    cfgs = [by[n] for n in names]
    if not args.configs and tier != "full":  # the quick tier names the matrix's configs still missing support too
        cfgs += [c for c in CONFIGS if c["name"] not in names and missing(c)]
    passed = failed = skipped = compared = steps_run = 0
    run = []
    for c in cfgs:
        why = missing(c)
        if why:
            skipped += 1
            print("train_titan_matrix: SKIP %-20s not yet landed: %s" % (c["name"], "; ".join(why)))
        else:
            run.append(c)
    t0 = time.time()
    for c in run:
        build_plan(c, steps)
    print("plans built: %d (%.0f s)" % (len(run), time.time() - t0))
    import json
    import statistics
    for world in sorted({world_of(c["mesh"]) for c in run}):
        group = [c for c in run if world_of(c["mesh"]) == world]
        with tempfile.TemporaryDirectory(prefix="titan_matrix_") as tmp:
            result = os.path.join(tmp, "result.json")
            t1 = time.time()
            rc = H.launch(torchrun, __file__, world, [
                "--worker", "--steps", steps, "--configs", ",".join(c["name"] for c in group), "--tmp", tmp,
                "--result", result, "--t0", time.time()], 1800)
            if rc != 0 or not os.path.exists(result):
                failed += len(group)
                print("train_titan_matrix: FAIL torchrun with %d ranks (%s) exited %d" % (world, ", ".join(c["name"] for c in group),
                                                                      rc))
                continue
            with open(result) as f:
                out = json.load(f)
            print("torchrun with %d ranks: %d configs in %.0f s" % (world, len(group), time.time() - t1))
        for i, c in enumerate(group):
            rows = [out[r][i] for r in range(world)]
            nbad = sum(len(r["bad"]) for r in rows)
            n = sum(r["compared"] for r in rows)
            compared += n
            steps_run += steps
            ok = nbad == 0 and n > 0
            passed, failed = passed + ok, failed + (not ok)
            warm = slice(min(2, steps - 1), None)
            med = [statistics.median([t for r in rows for t in r[k][warm]] or [0]) * 1e3 for k in ("host_a", "host_b")]
            print("train_titan_matrix: %s %-20s %d ranks, %d steps x %d micro-batches, clip %g%s: %s (%d tensors x ranks compared); "
                  "host ms/step torchtitan %.1f, bridge %.1f; wall %.0f s" % (
                      "ok  " if ok else "FAIL", c["name"], world, steps, MICRO, MAX_NORM,
                      ", DCP round trips both ways from step %d" % (steps // 2) if c["ckpt"] else "",
                      "every loss, grad norm, sharded parameter and gradient bit-identical" if ok
                      else "%d differences" % nbad, n, med[0], med[1], rows[0].get("wall", 0)))
            for rk, r in enumerate(rows):
                for x in r["bad"][:4]:
                    print("    rank %d: %s" % (rk, x))
            if "norms" in rows[0]:
                print("    rank 0: losses %r .. %r, grad norms %r .. %r (clipped to %g)"
                      % (rows[0]["losses"][0], rows[0]["losses"][1], rows[0]["norms"][0], rows[0]["norms"][1], MAX_NORM))
    print("train_titan_matrix: %d passed, %d failed, %d skipped (%d configs, %d steps, %d tensors x ranks compared)"
          % (passed, failed, skipped, len(cfgs), steps_run, compared))
    if tier != "full":
        print("quick tier: %s (HSDP, selective AC, ChunkedLossWrapper, DCP round trips) at %d steps; "
              "COMMPLAN_TEST_TIER=full runs all %d configs (FSDP, HSDP, FSDP x TP, HSDP x TP on 8 ranks x no, "
              "selective and full AC x both losses) at %d steps" % (", ".join(QUICK), QUICK_STEPS, len(CONFIGS), FULL_STEPS))
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
