#!/usr/bin/env python3
"""torchtitan 0.3's context parallelism recorded live on gloo, against commplan's tables.

torchtitan's own path on 4 CPU ranks over gloo: its llama3 (tiny numbers, unfused q/k/v as the
llama family, FlexAttention as its registry builds every llama3), parallelize_llama at
dp_shard x cp with the default spmd_backend "spmd_types" (and once with the legacy
"partial_dtensor"), bf16 all-gathers and fp32 reductions (summed: set_force_sum_reduction_for_comms,
gloo has no PREMUL_SUM), and the trainer's step: post_dataloading_process's CP part
(prepare_context_parallel_input with the default "headtail" load balancer: inputs, labels,
positions and the flex block mask sharded on the sequence; annotate_input_spmd_types), then
Trainer._forward_backward_body (pred = model(...); CrossEntropyLoss; backward). Every collective
each rank issues in the forward and backward is recorded in issue order: kind, elements per rank
(the all-gather's input, the reduce-scatter's output, the all-reduce's buffer), dtype, reduce op,
the group's rank list, phase, and the tensors' shapes (what docs/context-parallel.md states).

What is recorded: every op of the c10d namespace (torch.distributed's eager collectives, which
spmd_types' redistributions and FSDP2 call) and of _c10d_functional (wait_tensor left out), by a
TorchDispatchMode (funcol's _wrap_tensor_autograd, no collective, left out too); and funcol.all_gather_single / reduce_scatter_single called inside
torch's custom ops (cplib::flex_cp_allgather, the legacy backend's K/V exchange, runs its
collectives below the dispatch mode), by wrapping them.

CPU stand-ins, none touching a collective, its size or its order:
  - FlexAttention: torchtitan runs torch.compile(flex_attention) and flex refuses CPU tensors;
    here the eager higher-order op runs with the device check lifted (as tests/titan/
    test_llama_acts.py does), outside the recorder's dispatch mode (which torch.compile's
    wrapper of the eager op refuses; the attention issues no collective);
  - the CP block mask: torch compiles create_block_mask once (_compiled_create_block_mask);
    here the eager create_block_mask builds the same mask;
  - torchtitan picks "cuda" as its device type without a GPU (titan_env.cpu_titan).
What a GPU run does differently: NCCL instead of gloo (the same calls; FSDP2's reductions as
PREMUL_SUM(1) instead of the forced SUM), and the compiled flex kernels. Not recorded: the
trainer's all-reduce of the global token count over the batch mesh before the step (one int64,
outside the forward and backward; commplan models neither) and the optimizer.

Meshes (world 4): dp2_cp2 (dp_shard 2 x cp 2), cp4 (cp 4), hsdp_cp2 (dp_replicate 2 x cp 2),
dp2_cp2 under partial_dtensor, and dp2_cp2 under torchtitan's own activation checkpointing
(SelectiveAC and FullAC as the Trainer builds them, applied by parallelize_llama to every block:
the backward re-runs each block's K/V all-gathers before their gradients' reduce-scatters). 2 steps
each; local batch 2, seq_len 512 (flex's CP block mask needs seq_len divisible by cp x 128).
Besides llama: qwen3, mixtral, DeepSeek-V3 and gpt-oss (parallelize_gptoss on its flex-attention
build, sinks and sliding window; tests/ep/torch_ep_record.py's builder) at the configs below.

commplan's side: the llama plan of the same model and mesh (build/titan/plans/ctxrec_*.lua,
fsdp.reduce_op "sum", training.local_batch_size 2, loss_chunks 1, activation_checkpointing as
recorded), its plan.json op list's
collectives in order, each group's rank list for that rank from plan.json's groups; its CP
collectives are plan.json's tp_all_gather / tp_reduce_scatter ops on group "cp" (the activation
collectives' op kinds, gen/parallel/cp.lua). Checks: every rank, every step, every collective
equal (kind, count, dtype, reduce op, group ranks): 0 differences; and the comparison can fail:
the dp2_cp2 recording against the plan without cp (dp_shard 4) differs.

Prints one "cp_record:" summary line; exit 0 when every check holds, 1 otherwise, 77 (SKIP)
without torch and torchtitan. --record-only records and prints the sequences (no commplan).
"""

import argparse
import json
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

sys.path.insert(0, os.path.join(E.ROOT, "python"))
NAME = "context parallel collectives vs commplan's tables (tests/titan/test_cp_record.py)"
OUT = os.path.join(E.ROOT, "build", "titan")
WORLD = 4
TITAN = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=250, multiple_of=16, ffn_dim_multiplier=1.3)
SEQ, BATCH, STEPS = 512, 2, 2
# name: (parallel degrees, spmd_backend, activation checkpointing)
CONFIGS = {
    "dp2_cp2": ({"dp_shard": 2, "cp": 2}, "spmd_types", "none"),
    "cp4": ({"dp_shard": 1, "cp": 4}, "spmd_types", "none"),
    "hsdp_cp2": ({"dp_replicate": 2, "dp_shard": 1, "cp": 2}, "spmd_types", "none"),
    "dp2_cp2_legacy": ({"dp_shard": 2, "cp": 2}, "partial_dtensor", "none"),
    "dp2_cp2_sac": ({"dp_shard": 2, "cp": 2}, "spmd_types", "selective"),
    "dp2_cp2_fullac": ({"dp_shard": 2, "cp": 2}, "spmd_types", "full"),
    # CP beside TP: sequence parallelism on (torchtitan's default) and off
    "cp2_tp2": ({"dp_shard": 1, "cp": 2, "tp": 2}, "spmd_types", "none"),
    "cp2_tp2_nosp": ({"dp_shard": 1, "cp": 2, "tp": 2, "sp": False}, "spmd_types", "none"),
    # qwen3 (fused wqkv, q/k norms; flex attention, its registry's default)
    "qwen3_dp2_cp2": ({"dp_shard": 2, "cp": 2, "family": "qwen3"}, "spmd_types", "none"),
    "qwen3_cp2_tp2": ({"dp_shard": 1, "cp": 2, "tp": 2, "family": "qwen3"}, "spmd_types", "none"),
    # an MoE family (torchtitan's Qwen3 MoE decoder without q/k norms, flex attention), ep = 1 and ep 2
    "mixtral_dp2_cp2": ({"dp_shard": 2, "cp": 2, "family": "mixtral"}, "spmd_types", "none"),
    "mixtral_dp2_cp2_ep2": ({"dp_shard": 2, "cp": 2, "ep": 2, "family": "mixtral"}, "spmd_types", "none"),
    # DeepSeek-V3 (MLA: K and V of different widths; flex attention, its registry's default)
    "dsv3_dp2_cp2": ({"dp_shard": 2, "cp": 2, "family": "deepseek_v3"}, "spmd_types", "none"),
    "dsv3_cp2_tp2": ({"dp_shard": 1, "cp": 2, "tp": 2, "family": "deepseek_v3"}, "spmd_types", "none"),
    # gpt-oss (flex attention: torchtitan's gpt_oss_debugmodel_flex; sinks on flex's lse, block 0 a 128-token
    # sliding window, block 1 full), FSDP x CP, CP beside TP, and CP with EP
    "gpt_dp2_cp2": ({"dp_shard": 2, "cp": 2, "family": "gpt_oss"}, "spmd_types", "none"),
    "gpt_cp2_tp2": ({"dp_shard": 1, "cp": 2, "tp": 2, "family": "gpt_oss"}, "spmd_types", "none"),
    "gpt_dp2_cp2_ep2": ({"dp_shard": 2, "cp": 2, "ep": 2, "family": "gpt_oss"}, "spmd_types", "none"),
}
# tests/titan/test_moe_plan.py's tiny DeepSeek-V3 (TITAN's vocabulary)
DSV3 = dict(dim=64, n_layers=4, n_dense_layers=2, n_heads=4, vocab_size=250, q_lora_rank=16, kv_lora_rank=32,
            qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, dense_hidden_dim=96, moe_hidden_dim=32,
            num_experts=4, num_shared_experts=2, top_k=2)
# tests/titan/test_moe_plan.py's tiny mixtral (TITAN's vocabulary)
MIXTRAL = dict(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=250, moe_hidden_dim=48, num_experts=8, top_k=2)
# tests/titan/test_qwen3_plan.py's tiny qwen3 (TITAN's vocabulary)
QWEN3 = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=250, hidden_dim=96)
# tests/ep/ep_cases.py's tiny gpt-oss, TITAN's vocabulary, the experts' hidden 32 (16-byte grouped-mm strides)
GPT_OSS = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=250, moe_hidden_dim=32,
               num_experts=4, top_k=2)
# keys of a config's degrees that are not ParallelDims degrees
NOT_DEGREES = ("sp", "family")
# The quick tier (make test) runs these, one a path: CP under FSDP with full AC's recompute (the
# spmd_types backend), the partial_dtensor backend, CP beside TP, an MoE family with EP;
# COMMPLAN_TEST_TIER=full every config.
QUICK = ("dp2_cp2_fullac", "dp2_cp2_legacy", "cp2_tp2", "mixtral_dp2_cp2_ep2")
DT = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.int64": "int64"}
KIND = (("allgather", "all_gather"), ("all_gather", "all_gather"), ("reduce_scatter", "reduce_scatter"),
        ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"), ("alltoall", "all_to_all"),
        ("all_to_all", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"))


def _kind(name):
    for k, v in KIND:
        if k in name:
            return v
    return "other"


# ---- torchtitan's side (one process per rank) ----

class Recorder:
    def __init__(self):
        self.log = None      # the list being filled, or None (off)
        self.phase = "forward"
        self.tls = threading.local()

    def add(self, kind, count, dtype, op, ranks, shapes, via):
        if self.log is not None:
            self.log.append({"kind": kind, "count": int(count), "dtype": DT.get(str(dtype), str(dtype)),
                             "reduce_op": op, "ranks": [int(r) for r in ranks], "phase": self.phase,
                             "shapes": shapes, "via": via})


REC = Recorder()


def _pg_ranks(pg):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    if pg is None:
        return list(range(dist.get_world_size()))
    if isinstance(pg, str):
        pg = c10d._resolve_process_group(pg)
    elif not isinstance(pg, dist.ProcessGroup):  # the dispatcher's boxed ScriptObject
        pg = dist.ProcessGroup.unbox(pg)
    return [int(r) for r in dist.get_process_group_ranks(pg)]


def _op_name(op):
    import torch.distributed as dist
    if op is None:
        return None
    if not isinstance(op, (str, dist.ReduceOp)):
        op = dist.ReduceOp.unbox(op)
    if isinstance(op, dist.ReduceOp):
        op = op.op
    return str(op).split(".")[-1].lower()


def _tensors(x):
    import torch
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    return []


def _record_dispatch(func, args, kwargs, out):
    """One c10d / _c10d_functional op: bound by its schema's argument names."""
    name = func.overloadpacket.__name__
    bound = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
    pg = None
    for k, v in bound.items():
        if k in ("process_group", "group_name", "group") or type(v).__name__ == "ProcessGroup":
            pg = v
    kind = _kind(name)
    ins = [t for k, v in bound.items() if k.startswith("input") or k in ("tensors", "tensor", "self")
           for t in _tensors(v)]
    outs = [t for k, v in bound.items() if k.startswith("output") or k == "out" for t in _tensors(v)]
    if func.namespace == "_c10d_functional":
        outs = _tensors(out)
    if not outs:
        outs = ins
    # elements per rank: the all-gather's input, the reduce-scatter's output, the all-reduce's buffer
    count = sum(t.numel() for t in (outs if kind == "reduce_scatter" else ins))
    op = None
    for k in ("reduce_op", "reduceOp", "op"):
        if k in bound and bound[k] is not None and kind in ("all_reduce", "reduce_scatter"):
            op = _op_name(bound[k])
    if kind in ("all_reduce", "reduce_scatter") and op is None:
        op = "sum"
    shapes = {"in": [list(t.shape) for t in ins], "out": [list(t.shape) for t in outs]}
    REC.add(kind, count, (ins or outs)[0].dtype, op, _pg_ranks(pg), shapes, "%s.%s" % (func.namespace, name))


def make_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class CommMode(TorchDispatchMode):
        supports_higher_order_operators = True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            ns = getattr(func, "namespace", None)  # (a higher-order op has none: it issues no collective)
            if REC.log is not None and not getattr(REC.tls, "inside", False) and (
                    ns == "c10d" or (ns == "_c10d_functional" and not any(
                        w in func.overloadpacket.__name__ for w in ("wait", "wrap_tensor_autograd")))):
                _record_dispatch(func, args, kwargs, out)
            return out
    return CommMode()


def wrap_funcol():
    """funcol's K/V exchange calls, recorded where they run below the dispatch mode (inside
    cplib::flex_cp_allgather and its backward: the legacy backend's path)."""
    import torch.distributed._functional_collectives as funcol

    def wrap(name, kind):
        fn = getattr(funcol, name)
        if hasattr(fn, "_commplan_cp"):
            return

        def hooked(x, *a, **k):
            if REC.log is None:  # (not recording: DTensor's own redistributions while the model initializes)
                return fn(x, *a, **k)
            # all_gather_single(self, gather_dim, group); reduce_scatter_single(self, reduceOp,
            # scatter_dim, group)
            group = a[-1] if len(a) >= (3 if kind == "reduce_scatter" else 2) else k.get("group")
            REC.tls.inside = True
            try:
                out = fn(x, *a, **k)
            finally:
                REC.tls.inside = False
            shapes = {"in": [list(x.shape)], "out": [list(out.shape)]}
            ranks = _pg_ranks(group)
            if kind == "reduce_scatter":
                op = a[0] if a else k.get("reduceOp")
                REC.add(kind, x.numel() // len(ranks), x.dtype, str(op).lower(), ranks, shapes, "funcol." + name)
            else:
                REC.add(kind, x.numel(), x.dtype, None, ranks, shapes, "funcol." + name)
            return out
        hooked._commplan_cp = True
        setattr(funcol, name, hooked)
    wrap("all_gather_single", "all_gather")
    wrap("reduce_scatter_single", "reduce_scatter")


def cpu_stand_ins():
    """The CPU stand-ins of the module's docstring."""
    import torch.nn.attention.flex_attention as FA
    import torch.distributed.tensor.experimental._context_parallel._attention as CA
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 - the "fake" backend of degree-1 mesh dims
    from torch.utils._python_dispatch import _disable_current_modes
    from torchtitan.models.common.attention import FlexAttention
    E.cpu_titan()
    FA._validate_device = lambda *a: None

    def flex(*a, **k):
        with _disable_current_modes():
            return FA.flex_attention(*a, **k)
    FlexAttention._compiled_flex_attn = staticmethod(flex)
    CA._compiled_create_block_mask = FA.create_block_mask


def build_model(cfg, parallelism, training, pd, ac):
    """tests/titan/test_llama_plan.py's parallelize on CPU, with torchtitan's own activation
    checkpointing config (the Trainer's: SelectiveAC / FullAC with their defaults, which
    parallelize_llama applies to every block before fully_shard)."""
    import torch
    from torchtitan.config import CompileConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.llama3 import model_registry, parallelize_llama
    from torchtitan.trainer import Trainer
    spec = model_registry("debugmodel")
    spec.model = cfg
    cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training))
    with torch.device("cpu"):
        model = cfg.build()
    acc = {"none": None, "full": FullAC.Config(), "selective": SelectiveAC.Config()}[ac]
    return parallelize_llama(model, parallel_dims=pd, training=training, parallelism=parallelism,
                             compile_config=CompileConfig(), ac_config=acc, dump_folder=os.path.join(OUT, "dump"))


def build_qwen3(parallelism, training, pd):
    """torchtitan's qwen3 in the trainer's order (tests/tp_record.py's): meta device,
    parallelize_qwen3, to_empty, init_weights."""
    import torch
    import test_qwen3_plan as TQ
    model = TQ.parallelize(TQ.titan_config(None, QWEN3, False), parallelism, training, pd)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    return model


def build_moe(family, parallelism, training, pd):
    """tests/titan/test_moe_plan.py's mixtral (through parallelize_qwen3) or DeepSeek-V3 (through
    parallelize_deepseekv3), in the trainer's order, with torchtitan's round-robin routing
    (--debug.moe_force_load_balance: the routing fixed and known)."""
    import torch
    import test_moe_plan as TM
    from torchtitan.config import CompileConfig, DebugConfig
    from torchtitan.trainer import Trainer
    if family == "deepseek_v3":
        from torchtitan.models.deepseek_v3 import model_registry, parallelize_deepseekv3 as fn
        cfg, spec = TM.titan_config(family, None, DSV3), model_registry("debugmodel")
    elif family == "gpt_oss":
        sys.path.insert(0, os.path.join(E.ROOT, "tests", "ep"))
        import torch_ep_record as TE
        from torchtitan.models.gpt_oss import model_registry, parallelize_gptoss as fn
        cfg, spec = TE.titan_gpt_oss_config(GPT_OSS, max_seq_len=SEQ), model_registry("debugmodel", attn_backend="flex")
    else:
        from torchtitan.models.qwen3 import model_registry, parallelize_qwen3 as fn
        cfg, spec = TM.titan_config(family, None, MIXTRAL), model_registry("debugmodel_moe")
    spec.model = cfg
    cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training,
                                                 debug=DebugConfig(moe_force_load_balance=True)))
    with torch.device("meta"):
        model = cfg.build()
    model = fn(model, parallel_dims=pd, training=training, parallelism=parallelism, compile_config=CompileConfig(),
               ac_config=None, dump_folder=os.path.join(OUT, "dump"))
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    model.train()
    return model


def worker(rank, init, out_dir, names):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=WORLD)
    cpu_stand_ins()
    wrap_funcol()
    import spmd_types as spmd
    import test_llama_plan as TL
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.context_parallel import prepare_context_parallel_input
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types
    from torchtitan.distributed.utils import get_spmd_context, set_spmd_backend
    mode = make_mode()
    res = {}
    # One ParallelDims per mesh and backend, its configs one after the other on it: a second
    # ParallelDims of the same mesh in one process hands fully_shard a cached DeviceMesh that is not
    # its parameters' (as tests/ep/torch_ep_record.py does).
    built = {}
    for name in names:
        par, backend, ac = CONFIGS[name]
        tp = par.get("tp", 1)
        parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                        data_parallel_shard_degree=par["dp_shard"],
                                        context_parallel_degree=par["cp"], tensor_parallel_degree=tp,
                                        expert_parallel_degree=par.get("ep", 1),
                                        enable_sequence_parallel=par.get("sp", True), spmd_backend=backend)
        training = TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, dtype="float32",
                                  mixed_precision_param="bfloat16", mixed_precision_reduce="float32",
                                  disable_cuda_graphs=True)  # CUDA graphs refuse the CPU-syncing all-to-all dispatcher
        set_spmd_backend(backend)
        mesh_key = (tuple(sorted((k, v) for k, v in par.items() if k not in NOT_DEGREES)), backend)
        if mesh_key not in built:
            built[mesh_key] = ParallelDims.from_config(parallelism, WORLD)
            built[mesh_key].build_mesh()
        pd = built[mesh_key]
        torch.manual_seed(0)
        if par.get("family") == "qwen3":
            model = build_qwen3(parallelism, training, pd)
        elif par.get("family") in ("mixtral", "deepseek_v3", "gpt_oss"):
            model = build_moe(par["family"], parallelism, training, pd)
        else:
            model = build_model(TL.titan_config(None, TITAN, False), parallelism, training, pd, ac)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
        loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=TITAN["vocab_size"]))
        cp_mesh = pd.get_mesh("cp")
        dp_index = rank // (par["cp"] * tp)  # the data shard: ranks of one cp x tp block read the same batch
        steps, losses = [], []
        for step in range(STEPS):
            g = torch.Generator().manual_seed(1000 * dp_index + step)
            t = torch.randint(0, TITAN["vocab_size"], (BATCH, SEQ + 1), generator=g)
            inputs, labels = t[:, :-1], t[:, 1:]
            positions = torch.arange(SEQ).repeat(BATCH, 1)
            # Trainer.post_dataloading_process
            extra = {"positions": positions, "attention_masks": model.get_attention_masks(positions=positions)}
            inputs, labels, extra = prepare_context_parallel_input(inputs, labels, extra, cp_mesh, "cpu", "headtail")
            if backend == "spmd_types":
                inputs, labels, extra = annotate_input_spmd_types(pd, inputs, labels, extra)
            gvt = torch.tensor(BATCH * SEQ * WORLD // (par["cp"] * tp))
            REC.log = []
            with get_spmd_context(parallel_dims=pd)(), mode:  # Trainer._forward_backward_body
                REC.phase = "forward"
                pred = model(inputs, **extra)
                loss, _ = loss_fn(pred, labels, gvt)
                del pred
                REC.phase = "backward"
                with spmd.no_typecheck():
                    loss.backward()
            steps.append(REC.log)
            REC.log = None
            losses.append(float(loss))
            for p in model.parameters():  # optimizer.zero_grad()
                p.grad = None
        groups = {}
        for n in ("cp", "loss"):
            groups[n] = _pg_ranks(pd.get_mesh(n).get_group())
        res[name] = {"steps": steps, "groups": groups, "losses": losses}
        del model
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump(res, fh)
    dist.destroy_process_group()


def batches(names):
    """The configs in runs of one process set each: two ParallelDims of one dense mesh (the same degrees
    but ep) cannot share a process (fully_shard would get the first one's cached DeviceMesh)."""
    def dense(n):
        return tuple((k, v) for k, v in sorted(CONFIGS[n][0].items()) if k not in NOT_DEGREES + ("ep",))

    def full(n):
        return tuple((k, v) for k, v in sorted(CONFIGS[n][0].items()) if k not in NOT_DEGREES)
    out = []
    for n in names:
        for b in out:
            if all(dense(n) != dense(m) or full(n) == full(m) for m in b):
                b.append(n)
                break
        else:
            out.append([n])
    return out


def record(names, out_dir):
    import tempfile
    import torch.multiprocessing as mp
    os.makedirs(out_dir, exist_ok=True)
    rec = [{} for _ in range(WORLD)]
    # The ranks forked from this process, torch and torchtitan imported once here (tests/tp_record.py's
    # way: this process makes no process group, mesh or thread); spawning imported them again in every
    # rank, seconds of CPU each. TITAN_START=spawn imports them per rank.
    start = os.environ.get("TITAN_START", "fork")
    if start == "fork":
        import spmd_types  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401
        import torchtitan.components.loss  # noqa: F401
        import torchtitan.distributed.parallel_dims  # noqa: F401
        import test_llama_plan  # noqa: F401
    for batch in batches(names):
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            mp.start_processes(worker, args=(os.path.join(tmp, "init"), out_dir, batch), nprocs=WORLD,
                               start_method=start)
        for r in range(WORLD):
            with open(os.path.join(out_dir, "rank%d.json" % r)) as fh:
                rec[r].update(json.load(fh))
    return rec


def show(rec, names):
    for name in names:
        cp_groups = sorted({tuple(r[name]["groups"]["cp"]) for r in rec})
        print("== %s (%s, checkpointing %s): cp groups %s" % (name, CONFIGS[name][1], CONFIGS[name][2], cp_groups))
        for e in rec[0][name]["steps"][0]:
            print("  %-8s %-14s %7d %-4s %-4s ranks %-12s %s -> %s  %s" % (
                e["phase"], e["kind"], e["count"], e["dtype"], e["reduce_op"] or "", e["ranks"], e["shapes"]["in"],
                e["shapes"]["out"], e["via"]))


# ---- commplan's side ----

TABLE_KIND = {"all_gather": "all_gather", "reduce_scatter": "reduce_scatter", "all_reduce": "all_reduce",
        "tp_all_gather": "all_gather", "tp_reduce_scatter": "reduce_scatter", "tp_all_reduce": "all_reduce",
        "a2a_counts": "all_to_all", "a2a": "all_to_all"}


def plan_for(name, parallel, ac="none"):
    """commplan's plan of the model and mesh: plan.json."""
    from commplan import plan_text
    parallel = dict(parallel)
    family = parallel.pop("family", "llama")
    model = dict({"llama": TITAN, "qwen3": dict(QWEN3, enable_weight_tying=False), "mixtral": MIXTRAL,
                  "deepseek_v3": DSV3, "gpt_oss": dict(GPT_OSS, attn_backend="flex")}[family],
                 family=family, seq_len=SEQ)
    if "sp" in parallel:
        parallel["sequence_parallel"] = parallel.pop("sp")
    text = plan_text(name, WORLD, model, parallel=parallel,
                     fsdp={"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum"},
                     training={"local_batch_size": BATCH, "loss_chunks": 1, "activation_checkpointing": ac})
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(path, E.ROOT), os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def group_ranks(plan, name, rank):
    """A group's rank list for rank, from plan.json's groups (member dims' sizes and strides)."""
    g = next(x for x in plan["groups"] if x["name"] == name)
    sizes, strides = g["members"]["sizes"], g["members"]["strides"]
    base = rank
    for n, st in zip(sizes, strides):
        base -= ((rank // st) % n) * st
    out = [base]
    for n, st in zip(sizes, strides):
        out = [r + k * st for r in out for k in range(n)]
    return sorted(out)


def table_step(plan, rank):
    """One step's collectives of rank from the tables: (kind, count, dtype, reduce op, ranks). EP's
    all-to-alls (torchtitan's spmd_types dispatcher: c10d.alltoall_ of lists, its count the list's
    elements): the counts exchange sends each member its experts' int64 counts (per member x ep), the
    dispatch and combine capacity x dim rows (under torchtitan's forced round-robin routing, exactly)."""
    out = []
    for o in plan["ops"]:
        if o["kind"] in TABLE_KIND and o.get("group"):
            ranks = tuple(group_ranks(plan, o["group"], rank))
            count, dtype = o["count"], o["dtype"]
            if o["kind"] == "a2a_counts":
                count, dtype = count * len(ranks), "int64"
            out.append((TABLE_KIND[o["kind"]], count, dtype, o.get("reduce_op"), ranks))
    return out


def recorded(step):
    return [(e["kind"], e["count"], e["dtype"], e["reduce_op"], tuple(sorted(e["ranks"]))) for e in step]


def diff(got, want):
    n = sum(1 for a, b in zip(got, want) if a != b) + abs(len(got) - len(want))
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                 None if len(got) == len(want) else min(len(got), len(want)))
    return n, first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--record-only", action="store_true", help="record and print the sequences; no commplan")
    full = os.environ.get("COMMPLAN_TEST_TIER") == "full"
    ap.add_argument("--configs", default=",".join(CONFIGS if full else QUICK))
    a = ap.parse_args()
    if not full and a.configs == ",".join(QUICK):
        print("quick tier: %s; COMMPLAN_TEST_TIER=full adds %s" % (
            ", ".join(QUICK), ", ".join(c for c in CONFIGS if c not in QUICK)))
    E.need_titan(NAME)
    names = [c for c in a.configs.split(",") if c]
    for c in names:
        if c not in CONFIGS:
            sys.exit("test_cp_record: unknown config %r; known: %s" % (c, ", ".join(CONFIGS)))
    plans = {}

    def key(c):
        return tuple(sorted(CONFIGS[c][0].items())) + (CONFIGS[c][2],)
    if not a.record_only:  # (commplan first: a refusal costs no torch run)
        for c in names:
            if key(c) not in plans:
                plans[key(c)] = plan_for("ctxrec_" + c, CONFIGS[c][0], CONFIGS[c][2])
    rec = record(names, os.path.join(OUT, "cp_record"))
    if a.record_only:
        show(rec, names)
        return 0
    problems, compared, cp_ops = [], 0, 0
    for c in names:
        plan = plans[key(c)]
        for r in range(WORLD):
            want = table_step(plan, r)
            on_cp = [i for i, o in enumerate(o for o in plan["ops"] if o["kind"] in TABLE_KIND and o.get("group"))
                     if o["group"] == "cp"]
            for step, got in enumerate(rec[r][c]["steps"]):
                got = recorded(got)
                n, at = diff(got, want)
                compared += len(got)
                cp_ops += sum(1 for i in on_cp if i < len(got) and got[i] == want[i])
                if n:
                    problems.append("%s rank %d step %d: %d differences, first at collective %s: torchtitan %r, "
                                    "commplan %r" % (c, r, step + 1, n, at, got[at] if at is not None and at < len(got)
                                                     else None, want[at] if at is not None and at < len(want) else None))
        kinds = {}
        for g in recorded(rec[0][c]["steps"][0]):
            kinds[g[0]] = kinds.get(g[0], 0) + 1
        print("  %-14s %-15s %-9s %d ranks x %d steps: %d collectives per rank-step (%s), commplan's tables %d" % (
            c, CONFIGS[c][1], CONFIGS[c][2], WORLD, STEPS, len(rec[0][c]["steps"][0]),
            ", ".join("%d %s" % (v, k) for k, v in sorted(kinds.items())), len(table_step(plan, 0))))
    # The comparison can fail: the dp2_cp2 recording against the plan without cp (FSDP over the 4 ranks).
    first = names[0]
    fam = CONFIGS[first][0].get("family", "llama")
    nocp = plan_for("ctxrec_nocp_" + fam, {"dp_shard": WORLD, "family": fam})
    n, _ = diff(recorded(rec[0][first]["steps"][0]), table_step(nocp, 0))
    if n == 0:
        problems.append("%s: the plan without cp (dp_shard %d) matched the recording too" % (first, WORLD))
    else:
        print("  %-14s against the plan without cp (dp_shard %d): %d differences, as it must" % (first, WORLD, n))
    # CP beside TP: a plan whose K/V exchange ignores TP (every rank's whole kv heads), or runs it after
    # the attention's TP collectives instead of between them, differs from the recording.
    for c in (x for x in names if CONFIGS[x][0].get("tp", 1) > 1):
        got, want = recorded(rec[0][c]["steps"][0]), table_step(plans[key(c)], 0)
        on_cp = [i for i, o in enumerate(o for o in plans[key(c)]["ops"] if o["kind"] in TABLE_KIND and o.get("group"))
                 if o["group"] == "cp"]
        tp = CONFIGS[c][0]["tp"]
        wide = [(w[0], w[1] * tp) + w[2:] if i in on_cp else w for i, w in enumerate(want)]
        late = list(want)
        for i in reversed(on_cp):
            if i + 1 < len(late) and i + 1 not in on_cp:
                late[i], late[i + 1] = late[i + 1], late[i]
        for what, mutant in (("K/V counts not divided by tp", wide), ("K/V exchange out of place among the TP collectives", late)):
            n, _ = diff(got, mutant)
            if n == 0:
                problems.append("%s: the plan with its %s matched the recording too" % (c, what))
            else:
                print("  %-14s against its plan with the %s: %d differences, as it must" % (c, what, n))
    # EP beside CP: a plan routing every token of the sequence (not the rank's seq_len / cp) differs.
    for c in (x for x in names if CONFIGS[x][0].get("ep", 1) > 1):
        got, want = recorded(rec[0][c]["steps"][0]), table_step(plans[key(c)], 0)
        cpd = CONFIGS[c][0]["cp"]
        wide = [(w[0], w[1] * cpd) + w[2:] if w[0] == "all_to_all" and w[2] != "int64" else w for w in want]
        n, _ = diff(got, wide)
        if n == 0:
            problems.append("%s: the plan routing whole sequences matched the recording too" % c)
        else:
            print("  %-14s against its plan routing whole sequences (not seq_len / cp): %d differences, as it must"
                  % (c, n))
    for p in problems[:20]:
        print("FAIL", p)
    from importlib.metadata import version
    print("cp_record: %d collectives compared (%d of them cp's K/V all-gathers and reduce-scatters, equal) over %d configs x %d ranks x %d steps from "
          "torchtitan %s (torch %s): %d differences" % (compared, cp_ops, len(names), WORLD, STEPS,
                                                       version("torchtitan"), E.versions()[0], len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
