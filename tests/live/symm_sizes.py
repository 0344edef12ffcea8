"""fsdp.symm_mem live on CPU: the buffers FSDP2 would put in symmetric memory, against the plan's window.

torchtitan's enable_fsdp_symm_mem (distributed/fsdp.py:44-51) calls set_force_sum_reduction_for_comms(True)
and set_symm_mem_for_comm() on every FSDP module. The latter swaps FSDP2's all-gather and reduce-scatter
comms for SymmMemAllGather / SymmMemReduceScatter (torch 2.15 _fsdp_param_group.py:402-422), whose
allocate() serves the very call sites the default comms serve (_fsdp_collectives.py:377 the all-gather
output, :659 the reduce-scatter input, :674 its output) from symm_mem's MemPool, then rendezvouses
them on the collective's group. gloo has no symmetric memory, and that MemPool is CUDA's: on a CPU
mesh the swap cannot run, so this script (1) records what set_symm_mem_for_comm() does on gloo (the
refusal or failure, one line), then (2) runs FSDP2 with the forced sums torchtitan sets and records
every allocate() of those call sites per rank: (kind, bytes) for one steady-state step, and (3)
compares them, as multisets, with plan.json's symmetric buffers times the plan's collectives (an
all-gather op allocates its unit's ag; a reduce-scatter op its rs_in and rs_out), and checks every
rank's list is the same (the property the window's equal offsets stand on). Exit 0 when all agree.

Usage: python symm_sizes.py PLAN_DIR...   (each holding plan.json of a plan with fsdp.symm_mem, FSDP or
HSDP without TP/PP/EP; run under flock /tmp/commplan-heavy.lock).
"""
import json
import os
import sys
import tempfile
from collections import Counter

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ES = {"fp32": 4, "bf16": 2, "fp16": 2, "u8": 1}


class Unit(nn.Module):
    """A unit's parameters (full shapes); forward adds each parameter's sum to the activation."""

    def __init__(self, params, dtype):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(*p["shape"], dtype=dtype) * 0.01) for p in params])

    def forward(self, x):
        for p in self.ps:
            x = x + p.float().sum()
        return x


class Model(nn.Module):
    def __init__(self, units, root, dtype):
        super().__init__()
        self.blocks = nn.ModuleList([Unit(u["params"], dtype) for u in units])
        self.own = Unit(root["params"], dtype) if root and root["params"] else None

    def forward(self, x):
        if self.own is not None:
            x = self.own(x)
        for b in self.blocks:
            x = b(x)
        return x


def expected(j):
    """The plan's symmetric allocations in one step: Counter of (kind, bytes)."""
    arena = {u["name"]: u["arena"] for u in j["units"]}
    want = Counter()
    for o in j["ops"]:
        kinds = {"all_gather": ("ag",), "reduce_scatter": ("rs_in", "rs_out")}.get(o["kind"], ())
        for k in kinds:
            b = arena[o["unit"]][k]
            if b.get("symmetric"):
                want[(k, b["bytes"])] += 1
    return want


def worker(rank, world, init, plan_json, out_dir):
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as C
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    j = json.load(open(plan_json))
    par = j["parallel"]
    R, S = par["dp_replicate"], par["dp_shard"]
    mesh = init_device_mesh("cpu", (R, S), mesh_dim_names=("dp_replicate", "dp_shard")) if R > 1 else \
        init_device_mesh("cpu", (S,), mesh_dim_names=("dp_shard",))
    units = [u for u in j["units"] if not u["root"]]
    root = next((u for u in j["units"] if u["root"]), None)
    units.sort(key=lambda u: u["index"])
    stored = DT[units[0]["orig_dtype"]]
    torch.manual_seed(0)
    model = Model(units, root, stored)
    for u, b in zip(units, model.blocks):
        mpp = MixedPrecisionPolicy(param_dtype=DT[u["ag_dtype"]], reduce_dtype=DT[u["reduce_dtype"]])
        fully_shard(b, mesh=mesh, mp_policy=mpp, reshard_after_forward=u["reshard_after_forward"])
    mpp = MixedPrecisionPolicy(param_dtype=DT[root["ag_dtype"]], reduce_dtype=DT[root["reduce_dtype"]])
    fully_shard(model, mesh=mesh, mp_policy=mpp)
    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    # (1) torchtitan's enable_fsdp_symm_mem on gloo: what set_symm_mem_for_comm() does here
    try:
        mods[0].set_symm_mem_for_comm()
        swap = "set_symm_mem_for_comm() accepted on gloo (%s)" % type(
            mods[0]._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm).__name__
        x = torch.ones(1)
        try:
            model(x).sum().backward()
            swap += "; a step ran"
        except Exception as e:  # the symmetric MemPool is CUDA's
            swap += "; the first step fails: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:160])
    except Exception as e:
        swap = "set_symm_mem_for_comm() on gloo/CPU: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:160])
    # (2) the forced sums torchtitan sets, default comms, every allocate() of the symmetric call sites recorded
    for m in mods:
        m.set_force_sum_reduction_for_comms(True)
        for g in m._get_fsdp_state()._fsdp_param_groups:
            g._all_gather_comm, g._reduce_scatter_comm = C.DefaultAllGather(), C.DefaultReduceScatter()
    log = []
    orig_ag, orig_rs = C.DefaultAllGather.allocate, C.DefaultReduceScatter.allocate
    rs_phase = {}

    def ag_alloc(self, size, *, dtype, device):
        t = orig_ag(self, size, dtype=dtype, device=device)
        log.append(("ag", t.numel() * t.element_size()))
        return t

    def rs_alloc(self, size, *, dtype, device):
        t = orig_rs(self, size, dtype=dtype, device=device)
        # foreach_reduce allocates the input first, then the output (_fsdp_collectives.py:659, 674)
        k = "rs_out" if rs_phase.get("open") else "rs_in"
        rs_phase["open"] = not rs_phase.get("open")
        log.append((k, t.numel() * t.element_size()))
        return t

    C.DefaultAllGather.allocate, C.DefaultReduceScatter.allocate = ag_alloc, rs_alloc
    micro = j["fsdp"]["micro_steps"]
    steps = []
    for _ in range(2):
        log.clear()
        for _m in range(micro):
            model(torch.ones(1)).sum().backward()
        steps.append(list(log))
        for p in model.parameters():
            p.grad = None
    json.dump({"swap": swap, "step": steps[-1]}, open(os.path.join(out_dir, "r%d.json" % rank), "w"))
    dist.destroy_process_group()


def check(plan_dir):
    plan_json = os.path.join(plan_dir, "plan.json")
    j = json.load(open(plan_json))
    if not j["fsdp"].get("symm_mem"):
        return "%s: plan.json has no fsdp.symm_mem" % plan_dir, False
    world = j["world_size"]
    # The ranks forked from this process with FSDP2 imported once, here (tests/titan/test_fused_plan.py's way;
    # this process makes no process group or mesh); spawning imported torch again in every rank, seconds of
    # CPU each. SYMM_START=spawn spawns them.
    start = os.environ.get("SYMM_START", "fork")
    if start == "fork":
        import torch.distributed.device_mesh  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives  # noqa: F401
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(worker, args=(world, os.path.join(d, "init"), plan_json, d), nprocs=world, join=True,
                           start_method=start)
        got = [json.load(open(os.path.join(d, "r%d.json" % r))) for r in range(world)]
    want = expected(j)
    # the mutant: the plan's first symmetric all-gather buffer 256 bytes larger must not pass
    wrong = Counter(want)
    k0 = sorted(k for k in want if k[0] == "ag")[0]
    wrong[k0] -= 1
    wrong[(k0[0], k0[1] + 256)] += 1
    if any(Counter(tuple(x) for x in g["step"]) == wrong for g in got):
        return "%s: the mutant plan (an all-gather buffer 256 bytes larger) passed" % j["plan"], False
    ok = True
    lines = ["%s (%d ranks): %s" % (j["plan"], world, got[0]["swap"])]
    for r, g in enumerate(got):
        have = Counter(tuple(x) for x in g["step"])
        if have != want:
            ok = False
            lines.append("  rank %d: FSDP2 allocates %s, the plan's window holds %s" % (r, dict(have), dict(want)))
        if g["step"] != got[0]["step"]:
            ok = False
            lines.append("  rank %d allocates another sequence than rank 0" % r)
    n = sum(want.values())
    if ok:
        lines.append("  every rank: %d symmetric allocations in a step (%s), each the plan's bytes, the same "
                     "sequence on every rank; window %d bytes per rank; the mutant (one all-gather buffer "
                     "256 bytes larger) fails" % (
                         n, ", ".join("%s %d B x%d" % (k, b, c) for (k, b), c in sorted(want.items())),
                         j["memory"]["symm_window_bytes"]))
    return "\n".join(lines), ok


def nccl_one_rank(plan_dir):
    """--nccl (bench/gpu_symm.sh, a lent GPU): torchtitan's enable_fsdp_symm_mem for real on NCCL, one rank
    (one GPU): the comms it installs, that a step runs, and every SymmMemAllGather / SymmMemReduceScatter
    allocate() against the plan's units at W = 1 (no padding: each unit's elements in its ag / reduce dtype)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as C
    from torch.distributed.device_mesh import init_device_mesh

    j = json.load(open(os.path.join(plan_dir, "plan.json")))
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("nccl", init_method="file://" + os.path.join(d, "init"), rank=0, world_size=1)
    torch.cuda.set_device(0)
    mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp_shard",))
    units = sorted([u for u in j["units"] if not u["root"]], key=lambda u: u["index"])
    root = next((u for u in j["units"] if u["root"]), None)
    with torch.device("cuda"):
        model = Model(units, root, DT[units[0]["orig_dtype"]])
    for u, b in zip(units, model.blocks):
        fully_shard(b, mesh=mesh, mp_policy=MixedPrecisionPolicy(DT[u["ag_dtype"]], DT[u["reduce_dtype"]]),
                    reshard_after_forward=u["reshard_after_forward"])
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(DT[root["ag_dtype"]], DT[root["reduce_dtype"]]))
    for m in model.modules():  # torchtitan distributed/fsdp.py:48-51
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
            m.set_symm_mem_for_comm()
    comms = sorted({"%s/%s" % (type(g._all_gather_comm).__name__, type(g._reduce_scatter_comm).__name__)
                    for m in model.modules() if isinstance(m, FSDPModule)
                    for g in m._get_fsdp_state()._fsdp_param_groups})
    log = []
    for cls, name in ((C.SymmMemAllGather, "ag"), (C.SymmMemReduceScatter, "rs")):
        orig = cls.allocate

        def rec(self, size, *, dtype, device, _o=orig, _n=name):
            t = _o(self, size, dtype=dtype, device=device)
            log.append((_n, t.numel() * t.element_size()))
            return t
        cls.allocate = rec
    model(torch.ones(1, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    sizes = {"ag": set(), "rs": set()}  # each unit's bytes at W = 1: its elements in the ag / reduce dtype
    for u in j["units"]:
        numel = sum(int(torch.Size(p["shape"]).numel()) for p in u["params"])
        if numel:
            sizes["ag"].add(numel * ES[u["ag_dtype"]])
            sizes["rs"].add(numel * ES[u["reduce_dtype"]])
    have = Counter(log)
    ok = len(log) > 0 and all(b in sizes[k] for k, b in log)
    print(("ok    " if ok else "FAIL  ") + "%s on NCCL, 1 rank: comms %s; a step ran; %d symmetric allocations %s" % (
        j["plan"], ", ".join(comms), len(log), dict(have)))
    dist.destroy_process_group()
    return 0 if ok else 1


def main(argv):
    if argv[:1] == ["--nccl"]:
        return nccl_one_rank(argv[1])
    if not argv:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    all_ok = True
    for d in argv:
        text, ok = check(d)
        print(("ok    " if ok else "FAIL  ") + text)
        all_ok = all_ok and ok
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
