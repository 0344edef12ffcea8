#!/usr/bin/env python3
"""torchtitan 0.3's own pipeline (distributed/pipeline_parallel.py
pipeline_llm) run live on CPU (gloo) for the families beyond llama, recorded
(issue 35): PP on qwen3, and PP x EP on DeepSeek-V3 and Qwen3 MoE (torchtitan's
MoE with its ExpertParallel inside each stage). tests/pp/compare_titan_pp.lua holds
each rank's events, in order, to commplan's pipeline tables.

Per case, as torchtitan's Trainer builds a pipeline (trainer.py:443-478):
the model built on the meta device from torchtitan's own config builders
(qwen3: tests/titan/test_qwen3_plan.py's titan_config; DeepSeek-V3:
tests/ep/torch_ep_record.py's titan_model_config, routing forced round-robin
by torchtitan's --debug.moe_force_load_balance), ParallelDims(pp, dp_shard,
ep).build_mesh(), then pipeline_llm(model, parallelize_fn = the family's
parallelize_*: the stage split by _generate_llm_fqn_per_model_part, each
stage's module parallelized -- EP, FSDP with no reshard after forward --,
the schedule by _build_pipeline_schedule), each part to_empty +
init_weights, FSDP's reduce forced to SUM (gloo has no PREMUL_SUM / AVG; the
divide factor is 1 anyway). One step as pp_forward_backward_step runs it
(trainer.py:834-870): each microbatch's inputs annotated for spmd_types,
pp_schedule.step(arg_mbs, kwarg_mbs, target_mbs, losses).

Recorded per rank at the dispatcher (tests/ep/torch_ep_record.py's
recording: every c10d and _c10d_functional op, the FSDP group and the token
dispatcher's step as labels), plus the point-to-point ops: c10d.send /
recv_ with the peer's global rank. Events while the schedule initializes
its stages (_initialize_stage(s): shape inference) are phase "init"; the
comparison takes phase "step".

Output: <out-dir>/<case>.json: {"case", "spec", "ranks": [{"rank", "events"}]}.
Usage: torch_pp_titan_record.py [--out-dir build/pp/titan] [--cases a,b]
Exit 77 with a SKIP line when torch or torchtitan cannot be imported.
"""
import argparse
import json
import os
import sys
import tempfile
import traceback
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "titan"))
sys.path.insert(0, os.path.join(ROOT, "tests", "ep"))
sys.path.insert(0, HERE)
from pp_titan_cases import CASES, DEFAULT  # noqa: E402 - the cases, torch-free

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torchtitan.distributed.pipeline_parallel  # noqa: F401
    import torch_ep_record as EPR  # noqa: E402 - its recording (exits 77 itself without torchtitan)
except Exception as e:  # noqa: BLE001 - ImportError or a broken install
    print("SKIP pp-titan: torch and torchtitan are not importable by %s (%s: %s)" % (sys.executable,
                                                                                   type(e).__name__, e))
    sys.exit(77)

REC = EPR.REC
PHASE = {"phase": "step"}
MESHES = {}


def make_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class CommMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            ns, name = func.namespace, func.overloadpacket.__name__
            if REC.events is not None and (ns == "c10d" or (ns == "_c10d_functional" and "wait" not in name)):
                EPR._record(func, args, kwargs, out)
                ev = REC.events[-1]
                ev["phase"] = PHASE["phase"]
                if name in ("send", "recv_"):
                    ev["kind"] = "send" if name == "send" else "recv"
                    peer = args[2] if len(args) > 2 else kwargs.get("dstRank" if name == "send" else "srcRank")
                    ev["peer"] = ev["ranks"][int(peer)]
                    ev["numel"] = ev["in_numel"] or ev["out_numel"]
            return out
    return CommMode()


def tap_init(schedule):
    for name in ("_initialize_stage", "_initialize_stages"):
        orig = getattr(schedule, name, None)
        if orig is None:
            continue

        def hooked(*args, _orig=orig, **kwargs):
            PHASE["phase"] = "init"
            try:
                return _orig(*args, **kwargs)
            finally:
                PHASE["phase"] = "step"
        setattr(schedule, name, hooked)


def model_config(case):
    m = case["model"]
    if case["family"] == "qwen3":
        from test_qwen3_plan import titan_config
        return titan_config(None, m, tied=False, fused=True)
    if case["family"] in ("qwen3_moe", "mixtral"):
        # torchtitan's Qwen3 MoE builder (mixtral: without q/k norms), tests/titan/test_moe_plan.py's
        import test_moe_plan
        return test_moe_plan.titan_config(case["family"], None, m)
    if case["family"] == "gpt_oss":
        return EPR.titan_gpt_oss_config(m)
    return EPR.titan_model_config(m)


def run_case(rank, case, ids=None):
    import spmd_types as spmd  # noqa: F401
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import CompileConfig, DebugConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types
    from torchtitan.distributed.utils import get_spmd_context, set_spmd_backend
    from torchtitan.trainer import Trainer
    registry = "debugmodel"
    if case["family"] in ("qwen3", "qwen3_moe", "mixtral"):
        from torchtitan.models.qwen3 import model_registry, parallelize_qwen3 as parallelize_fn
        registry = "debugmodel" if case["family"] == "qwen3" else "debugmodel_moe"
    elif case["family"] == "gpt_oss":
        from torchtitan.models.gpt_oss import model_registry, parallelize_gptoss as parallelize_fn
    else:
        from torchtitan.models.deepseek_v3 import model_registry, parallelize_deepseekv3 as parallelize_fn

    csv_path = ""
    if case.get("csv"):  # torchtitan's pipeline_parallel_schedule_csv (issue 41): the case's CSV in a file
        csv_path = os.path.join(ROOT, "build", "pp", "titan", "schedule_%d.csv" % rank)
        os.makedirs(os.path.dirname(csv_path), exist_ok=True)
        with open(csv_path, "w", newline="") as fh:
            fh.write(case["csv"])
    parallelism = ParallelismConfig(data_parallel_shard_degree=case["dp_shard"], expert_parallel_degree=case["ep"],
                                    tensor_parallel_degree=case.get("tp", 1), enable_sequence_parallel=True,
                                    pipeline_parallel_degree=case["pp"],
                                    pipeline_parallel_schedule=case["schedule"],
                                    pipeline_parallel_schedule_csv=csv_path,
                                    pipeline_parallel_microbatch_size=1,
                                    fsdp_reshard_after_forward=case.get("raf", "default"))
    set_spmd_backend(parallelism.spmd_backend)  # as Trainer.__init__ does
    training = TrainingConfig(local_batch_size=case["batch"], seq_len=case["seq"], dtype="float32",
                              mixed_precision_param={"bf16": "bfloat16"}.get(case.get("param_dtype"), "float32"),
                              mixed_precision_reduce="float32",
                              disable_cuda_graphs=True)
    # cases of one mesh share its ParallelDims (a second one over the same
    # ranks hands fully_shard a cached DeviceMesh that is not its
    # parameters': tests/ep/torch_ep_record.py's MESHES)
    key = (case["world"], case["pp"], case["dp_shard"], case["ep"], case.get("tp", 1))
    if key not in MESHES:
        MESHES[key] = ParallelDims.from_config(parallelism, case["world"])
        MESHES[key].build_mesh()
    pd = MESHES[key]
    cfg = model_config(case)
    spec = model_registry(registry, attn_backend="flex") if case["family"] == "gpt_oss" else model_registry(registry)
    spec.model = cfg
    cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training,
                                                 debug=DebugConfig(moe_force_load_balance=True)))
    with torch.device("meta"):
        model = cfg.build()
    V = case["model"]["vocab_size"]

    def loss_fn(pred, labels, *args, **kwargs):
        return cross_entropy_loss(pred, labels, global_vocab_size=V), None

    sched, parts, has_first, has_last = pipeline_llm(
        model, parallel_dims=pd, training=training, parallelism=parallelism, compile_config=CompileConfig(),
        ac_config=EPR.ac_config(case.get("ac", "none")), dump_folder=os.path.join(ROOT, "build", "pp", "dump"),
        device=torch.device("cpu"), model_config=cfg, parallelize_fn=parallelize_fn, loss_fn=loss_fn)
    from torch.distributed.fsdp import FSDPModule
    torch.manual_seed(1234)
    for m in parts:
        m.to_empty(device="cpu")
        with torch.no_grad():
            m.init_weights(buffer_device=torch.device("cpu"))
        m.train()
        for mod in m.modules():
            if isinstance(mod, FSDPModule):
                mod.set_force_sum_reduction_for_comms(True)  # gloo: no PREMUL_SUM / AVG
    REC.group_names = EPR.group_names(pd, case["world"])
    for lname_part in parts:
        for lname, layer in getattr(lname_part, "layers", {}).items():
            if getattr(layer, "moe", None) is not None:
                layer.moe.routed_experts.token_dispatcher._ep_layer = "layers." + lname
    tap_init(sched)
    B, L = case["batch"], case["seq"]
    dp_rank = pd.get_optional_mesh("dp_shard").get_local_rank() if pd.dp_shard > 1 else 0
    tokens = torch.randint(0, V, (B, L + 1), generator=torch.Generator().manual_seed(100 + dp_rank))
    arg_mbs, kwarg_mbs, target_mbs = [], [], []
    for b in range(B):
        inputs, labels = tokens[b:b + 1, :-1].contiguous(), tokens[b:b + 1, 1:].contiguous()
        positions = torch.arange(L).repeat(1, 1)
        extra = {"positions": positions, "attention_masks": parts[0].get_attention_masks(positions=positions)}
        if pd.spmd_backend == "spmd_types":
            inputs, labels, extra = annotate_input_spmd_types(pd, inputs, labels, extra)
        arg_mbs.append((inputs,))
        kwarg_mbs.append(extra)
        target_mbs.append(labels)
    GP = EPR.GP
    if ids is not None:
        # commplan's oracle gradients (tests/ep/torch_ep_record.py's GradPattern) at each parameter's one
        # reduction (REDUCE_GRAD, after the last microbatch): commplan's simulation accumulates micro-step m's
        # pattern x (m + 1) over the M microbatches, sum M(M + 1) / 2, which the pattern's (micro + 1) factor takes
        M = case["batch"]
        GP.k, GP.rank, GP.micro, GP.injected = ids["ranks"][rank], rank, M * (M + 1) // 2 - 1, {}
        GP.names = {id(p): n for m in parts for n, p in EPR.named_parameters(m)}
    REC.events = []
    try:
        with get_spmd_context(parallel_dims=pd)(), make_mode():
            losses = [] if has_last else None
            sched.step(arg_mbs=arg_mbs if has_first else None, kwarg_mbs=kwarg_mbs,
                       target_mbs=target_mbs if has_last else None, losses=losses, return_outputs=False)
    finally:
        events, REC.events = REC.events, None
        pattern, GP.k = GP.k, None
    out = {}
    if ids is not None:
        if sorted(GP.injected) != sorted(pattern) or any(n != 1 for n in GP.injected.values()):
            raise AssertionError("gradient pattern: overwritten %s, commplan's parameters %s" % (
                GP.injected, sorted(pattern)))
        out["grads_local"] = {}
        for m in parts:
            for pname, p in EPR.named_parameters(m):
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                out["grads_local"][pname] = {"shape": list(g.shape),
                                             "values": g.detach().reshape(-1).double().tolist()}
    keep = ("i", "kind", "op", "ranks", "group", "in_numel", "out_numel", "dtype", "reduce_op", "in_splits",
            "out_splits", "row", "peer", "numel", "fsdp", "ep", "via", "recompute", "phase")
    out.update(rank=rank, events=[{k: e[k] for k in keep if k in e} for e in events])
    return out


def worker(rank, world, port, names, tmpdir, ids_dir=None):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    import titan_env as E
    E.cpu_training()
    EPR.flex_with_lse_on_cpu()  # gpt-oss's sinks on flex's lse (the others ask for none)
    EPR.install_labels()
    EPR.install_ep_labels()
    if ids_dir:
        EPR.install_grad_pattern()
    import spmd_types._dist
    spmd_types._dist.set_dist(EPR.GlooDist())
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world,
                            timeout=timedelta(seconds=90))
    for name in names:
        dist.barrier()
        try:
            ids = None
            if ids_dir:
                with open(os.path.join(ids_dir, name + ".ids.json")) as f:
                    ids = json.load(f)
            res = run_case(rank, CASES[name], ids)
        except Exception as e:  # noqa: BLE001 - recorded, the wrapper reports it
            res = {"rank": rank, "failed": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()}
        with open(os.path.join(tmpdir, "%s-r%d.json" % (name, rank)), "w") as f:
            json.dump(res, f)
        if "failed" in res:
            break
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "build", "pp", "titan"))
    ap.add_argument("--cases", default=DEFAULT)
    ap.add_argument("--ids", help="DIR/<case>.ids.json: commplan's parameter ids per rank "
                    "(tests/pp/compare_titan_pp.lua --write-plans): the reduced gradients of its oracle pattern")
    a = ap.parse_args()
    names = [n for n in a.cases.split(",") if n]
    for n in names:
        if n not in CASES:
            sys.exit("unknown case %s (known: %s)" % (n, ", ".join(sorted(CASES))))
    os.makedirs(a.out_dir, exist_ok=True)
    # one launch per mesh: its cases share one ParallelDims (another mesh's
    # over the same ranks would hand fully_shard a cached DeviceMesh)
    by_mesh = {}
    for n in names:
        c = CASES[n]
        by_mesh.setdefault((c["world"], c["pp"], c["dp_shard"], c["ep"], c.get("tp", 1)), []).append(n)
    rc = 0
    for (world, _, _, _, _), group in sorted(by_mesh.items()):
        with tempfile.TemporaryDirectory() as tmp:
            port = EPR.free_port()
            mp.start_processes(worker, args=(world, port, group, tmp, a.ids), nprocs=world, join=True,
                               start_method=os.environ.get("PP_START", "fork"))
            for n in group:
                ranks = []
                for r in range(world):
                    path = os.path.join(tmp, "%s-r%d.json" % (n, r))
                    if os.path.exists(path):
                        with open(path) as f:
                            ranks.append(json.load(f))
                failed = [x for x in ranks if "failed" in x]
                if failed or len(ranks) != world:
                    print("pp-titan: %s failed on rank %s: %s" % (n, failed[0]["rank"] if failed else "?",
                                                                  failed[0]["failed"] if failed else "missing"))
                    if failed:
                        sys.stderr.write(failed[0]["traceback"])
                    rc = 1
                    continue
                with open(os.path.join(a.out_dir, n + ".json"), "w") as f:
                    json.dump({"case": n, "spec": CASES[n], "ranks": ranks}, f)
                print("pp-titan: recorded %s (%d ranks)" % (n, world))
    sys.exit(rc)


if __name__ == "__main__":
    main()
