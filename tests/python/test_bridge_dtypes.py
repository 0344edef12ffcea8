"""The bridge (commplan.runtime.CommplanFSDP over the plan's host library) over every dtype and
gradient-accumulation combination the plan format allows, each against PyTorch's own FSDP2
(fully_shard on gloo, 4 ranks under torchrun) bit for bit: every micro-batch's loss and, after
every optimizer step, every rank's sharded gradients (before the update) and parameters (after).

The matrix (issue 42): the parameters' dtype and MixedPrecisionPolicy -- fp32 parameters with
param_dtype none / bf16 / fp16 crossed with reduce_dtype fp32 / bf16 / fp16, and bf16 or fp16
parameters reducing in their own dtype or in fp32 -- times every accumulation mode a bridge
plan can have (docs/plan-files.md, fsdp.micro_steps and grad_accumulation):

    every       fsdp2_default, micro_steps 1, two micro-batches per optimizer step (torchtitan's
                loop: every backward reduces, the bridge adds the reduced shards into .grad)
    default     fsdp2_default, micro_steps 2 on HSDP 2x2 (the second reduction view_out_add)
    sync_last   micro_steps 3, set_requires_gradient_sync(False) but on the last: the
                unsharded grads accumulate in the plan's grad_dtype (reduce_dtype)
    noreshard   sync_last, micro_steps 2, reshard_after_forward false
    ar_last     all_reduce_last, micro_steps 2 on HSDP 2x2 (set_requires_all_reduce(False))
    sum         fsdp2_default, micro_steps 2, reduce_op "sum" (FSDP2: gradient divide factor 1,
                SUM in the collectives)
    keep        fsdp2_default, micro_steps 3 on HSDP 2x2, reshard_after_backward false
                (set_reshard_after_backward(False) but on the last micro-batch)
    prefetch    fsdp2_default, micro_steps 2, explicit prefetching (set_modules_to_forward_prefetch /
                set_modules_to_backward_prefetch on three of the four units)
    raf2        fsdp2_default, micro_steps 2, reshard_after_forward = 2 (fully_shard's int: the
                backward all-gathers over pairs of ranks from a slice kept after forward)

and grad_accumulation = "step_end", which the bridge refuses with one line (checked once).
The model has an uneven shard, an empty one (rank 3) and a root owning a parameter.

    tests/python/test_bridge_dtypes.py [TORCHRUN] [--cases all|quick|NAME,...] [--list]

COMMPLAN_TEST_TIER=quick (make test) runs two cases, bf16 parameters with an fp32 reduce under
sync_last (mixed precision and the view of the unsharded-grads buffer in grad_dtype) and raf2
(reshard_after_forward = 2 through the bridge), and prints a
"quick tier:" line; full (make test-full), or run by hand, the whole matrix. Needs torch 2.x with
FSDP2 and torchrun (make torch-env); anywhere else one SKIP line and exit 77.
"""
import functools
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

import bridge_harness as H  # noqa: E402

TAG = "bridge_dtypes"
WORLD = 4
BUILD = os.path.join("build", "bridge_dtypes")
LUA = os.environ.get("LUA", "lua5.4")

# (parameters' dtype, param_dtype or None, reduce_dtype or None)
DTYPES = [("fp32", None, None), ("fp32", None, "bf16"), ("fp32", None, "fp16"),
          ("fp32", "bf16", "fp32"), ("fp32", "bf16", "bf16"), ("fp32", "bf16", "fp16"),
          ("fp32", "fp16", "fp32"), ("fp32", "fp16", "fp16"), ("fp32", "fp16", "bf16"),
          ("bf16", None, None), ("bf16", None, "fp32"), ("fp16", None, None), ("fp16", None, "fp32"),
          # issue 39: "keep" -- MixedPrecisionPolicy.param_dtype_override_fn keeps the gains (inp.g, out.g)
          # in fp32 while their units' Linear layers gather in bf16: FSDP2's uint8 all-gather (make_model)
          ("fp32", "bf16", "fp32", "keep"), ("fp32", "bf16", "bf16", "keep")]
# mode: (mesh, micro-batches per optimizer step, plan's fsdp options besides the dtypes)
MODES = {
    "every": ("fsdp", 2, {"micro_steps": 1}),
    "default": ("hsdp", 2, {"micro_steps": 2, "grad_accumulation": "fsdp2_default"}),
    "sync_last": ("fsdp", 3, {"micro_steps": 3, "grad_accumulation": "sync_last"}),
    "noreshard": ("fsdp", 2, {"micro_steps": 2, "grad_accumulation": "sync_last", "reshard_after_forward": False}),
    "ar_last": ("hsdp", 2, {"micro_steps": 2, "grad_accumulation": "all_reduce_last"}),
    "sum": ("fsdp", 2, {"micro_steps": 2, "reduce_op": "sum"}),
    # issue 39: set_reshard_after_backward(False) but on the last micro-batch (every unit and the root)
    "keep": ("hsdp", 3, {"micro_steps": 3, "grad_accumulation": "fsdp2_default", "reshard_after_backward": False}),
    # issue 39: explicit prefetching (set_modules_to_forward_prefetch / _backward_prefetch: prefetch_units)
    "prefetch": ("fsdp", 2, {"micro_steps": 2}),
    # issue 39 (h39r): fully_shard(reshard_after_forward=2) on every unit: each rank keeps a slice after
    # forward and backward all-gathers it over its pair of ranks (the plan's post-forward groups)
    "raf2": ("fsdp", 2, {"micro_steps": 2, "reshard_after_forward": 2}),
}
MESHES = {"fsdp": {"dp_shard": 4}, "hsdp": {"dp_replicate": 2, "dp_shard": 2}}
# The quick tier: bf16 params + fp32 reduce + sync_last (mixed precision and the unsharded-grads
# view in grad_dtype), and raf2 (the one quick check that sends reshard_after_forward = k through
# the bridge: the post-forward copy and the backward's all-gather over pairs); make test-full runs
# the whole matrix.
QUICK = ["fp32_bf16_fp32_sync_last", "fp32_bf16_fp32_raf2"]
STEPS = {"quick": 2, "full": 3}


def case_name(dt, mode):
    return "%s_%s_%s_%s%s" % (dt[0], dt[1] or "x", dt[2] or "x", mode, "_" + dt[3] if len(dt) > 3 else "")


def all_cases():
    return {case_name(dt, m): (dt, m) for dt in DTYPES for m in MODES}


def make_model(dtype, keep=False):
    """Three units and a root owning a parameter: in.weight (13, 12) shards 4,4,4,1 over 4 ranks,
    out.weight (5, 10) 2,2,1,0 (rank 3's shard is empty). keep: inp and out are a Linear and a
    gain g applied in the Linear's output dtype (a norm's fp32 weight), the gains kept in their
    dtype by keep_fn."""
    import torch
    import torch.nn as nn

    class Gained(nn.Module):
        def __init__(self, lin):
            super().__init__()
            self.lin = lin
            self.g = nn.Parameter(torch.ones(lin.out_features) + 0.01 * torch.arange(lin.out_features))

        def forward(self, x):
            y = self.lin(x)
            return y * self.g.to(y.dtype)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(12))
            self.inp = nn.Linear(12, 13)
            self.mid = nn.Linear(13, 10, bias=False)
            self.out = nn.Linear(10, 5)

        def forward(self, x):
            h = torch.tanh(self.inp(x * self.scale))
            return self.out(torch.relu(self.mid(h)))

    torch.manual_seed(1234)
    m = Net()
    if keep:
        m.inp, m.out = Gained(m.inp), Gained(m.out)
    with torch.no_grad():
        m.scale.add_(torch.randn(12) * 0.1)
    return m.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype])


def units_of(m):
    return [m.inp, m.mid, m.out]


def keep_fn(m):
    """param_dtype_override_fn keeping m's gains in their own dtype (None: the unit's param_dtype)."""
    kept = {id(p) for n, p in m.named_parameters() if n.endswith(".g")}
    return lambda p: p.dtype if id(p) in kept else None


def plan_fsdp(dt, mode):
    fsdp = dict(MODES[mode][2])
    if dt[1]:
        fsdp["param_dtype"] = dt[1]
    if dt[2]:
        fsdp["reduce_dtype"] = dt[2]
    return fsdp


def plan_name(case):
    return "bd_" + case


def prefetch_units(m, unit_class=None):
    """The prefetch mode's lists: inp forward-prefetches mid and out, mid backward-prefetches inp, the
    root backward-prefetches out then inp. unit_class: commplan.Unit (the plan), else FSDP2's setters."""
    if unit_class is not None:
        U = unit_class
        return [U(m.inp, forward_prefetch=[m.mid, m.out]), U(m.mid, backward_prefetch=[m.inp]), U(m.out),
                U(m, backward_prefetch=[m.out, m.inp])]
    m.inp.set_modules_to_forward_prefetch([m.mid, m.out])
    m.mid.set_modules_to_backward_prefetch([m.inp])
    m.set_modules_to_backward_prefetch([m.out, m.inp])
    return None


def write_plan(name, dt, mode, out_dir):
    import commplan
    keep = len(dt) > 3
    m = make_model(dt[0], keep)
    kw = {}
    if keep:  # the units' own MixedPrecisionPolicy, read by the plan writer (commplan.Unit's mp_policy)
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from commplan.runtime import TORCH_DTYPES
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[dt[1]], reduce_dtype=TORCH_DTYPES[dt[2]],
                                               param_dtype_override_fn=keep_fn(m))
    if mode == "prefetch":
        units = prefetch_units(m, functools.partial(commplan.Unit, **kw))
    else:
        units = [commplan.Unit(u, **kw) for u in units_of(m)] if kw else units_of(m)
    commplan.plan_from_module(m, units, plan_name(name), world_size=WORLD, parallel=dict(MESHES[MODES[mode][0]]),
                              fsdp=plan_fsdp(dt, mode), out=os.path.join(out_dir, plan_name(name) + ".lua"))


def check_step_end_refused():
    """grad_accumulation = "step_end": the bridge refuses it with one line naming the plan."""
    import commplan
    from commplan.runtime import CommplanFSDP
    with tempfile.TemporaryDirectory(prefix="bridge-stepend-") as tmp:
        dt = ("fp32", "bf16", "fp32")
        m = make_model(dt[0])
        fsdp = {"micro_steps": 2, "grad_accumulation": "step_end", "param_dtype": "bf16", "reduce_dtype": "fp32"}
        commplan.plan_from_module(m, units_of(m), "bd_stepend", world_size=WORLD, parallel=dict(MESHES["fsdp"]),
                                  fsdp=fsdp, out=os.path.join(tmp, "bd_stepend.lua"))
        subprocess.run([LUA, os.path.join(REPO, "gen", "commplan.lua"), os.path.join(tmp, "bd_stepend.lua"),
                        os.path.join(tmp, "out")], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        try:
            CommplanFSDP("bd_stepend", m, units_of(m), plan_json=os.path.join(tmp, "out", "plan.json"),
                         library=object())
        except commplan.PlanError as e:
            msg = str(e)
            if "\n" not in msg and "step_end" in msg and "bd_stepend" in msg:
                return None
            return "step_end refused with %r" % msg
        return "a step_end plan was accepted"


# ---- the ranks ----------------------------------------------------------------------------

def batch(rank, step, micro, dtype):
    import torch
    g = torch.Generator().manual_seed(50_000 + 1000 * rank + 10 * step + micro)
    return torch.randn(4, 12, generator=g).to(dtype), torch.randn(4, 5, generator=g)


def run_side(model, rank, steps, micro, dtype, before_micro, snaps):
    """steps x micro forward/backward, AdamW after each step; records losses, the local grads
    (before the update) and the local parameters (after it)."""
    import torch
    import torch.nn.functional as F
    # eps 1e-3: AdamW's default 1e-8 is 0 in fp16, and 0 / 0 would make every comparison NaN
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3, weight_decay=0.1, foreach=False)
    losses = []
    for s in range(steps):
        for k in range(micro):
            before_micro(k, micro)
            x, y = batch(rank, s, k, dtype)
            loss = F.mse_loss(model(x).float(), y) / micro
            loss.backward()
            losses.append(loss.detach())
        for n, p in model.named_parameters():
            g = p.grad
            snaps[(s, "grad", n)] = None if g is None else _local(g).detach().clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for n, p in model.named_parameters():
            snaps[(s, "param", n)] = _local(p).detach().clone()
    return torch.stack(losses)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def run_case(name, dt, mode, rank, steps):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from commplan.match import find_plan_json, load_plan_json
    from commplan.runtime import TORCH_DTYPES, CommplanFSDP, HostLibrary
    mesh_kind, micro, opts = MODES[mode]
    par = MESHES[mesh_kind]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard")) if mesh_kind == "hsdp" \
        else init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp_shard",))
    # the compute dtype of the inputs: what the first unit sees (FSDP2 casts them to param_dtype)
    in_dtype = TORCH_DTYPES[dt[0]]
    # PyTorch's side: fully_shard with the plan's MixedPrecisionPolicy and accumulation
    keep = len(dt) > 3
    a = make_model(dt[0], keep)
    mp = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[dt[1]] if dt[1] else None,
                              reduce_dtype=TORCH_DTYPES[dt[2]] if dt[2] else None,
                              param_dtype_override_fn=keep_fn(a) if keep else None)
    raf = opts.get("reshard_after_forward", True)
    for m in units_of(a):
        fully_shard(m, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
    fully_shard(a, mesh=mesh, mp_policy=mp)
    if mode == "prefetch":
        prefetch_units(a)
    if opts.get("reduce_op") == "sum":
        for m in units_of(a) + [a]:  # divide factor 1 and SUM (gloo has no PREMUL_SUM)
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    acc = opts.get("grad_accumulation", "fsdp2_default")

    def fsdp2_micro(k, n):
        last = k == n - 1
        if acc == "sync_last":
            a.set_requires_gradient_sync(last)
        elif acc == "all_reduce_last":
            a.set_requires_all_reduce(last)
        if opts.get("reshard_after_backward") is False:
            a.set_reshard_after_backward(last)
    snaps_a, snaps_b = {}, {}
    la = run_side(a, rank, steps, micro, in_dtype, fsdp2_micro, snaps_a)
    # the bridge's side: the same model, every collective and copy from the plan's host library
    b = make_model(dt[0], keep)
    pn = plan_name(name)
    pj = load_plan_json(find_plan_json(pn, REPO))
    lib = HostLibrary(os.path.join(REPO, "build", pn, "lib%s.so" % pn), pn, plan_json=pj)
    fsdp = CommplanFSDP(pn, b, units_of(b), root=REPO, library=lib)
    try:
        lb = run_side(b, rank, steps, micro, in_dtype, lambda k, n: None, snaps_b)
    finally:
        fsdp.close()
    bad = []
    if not torch.equal(la, lb):
        i = int((la != lb).nonzero()[0])
        bad.append("loss %d (step %d, micro-batch %d): FSDP2 %r, bridge %r"
                   % (i, i // micro, i % micro, la[i].item(), lb[i].item()))
    if not torch.isfinite(la).all():
        bad.append("FSDP2's losses are not all finite: the case compares nothing")
    for key, x in snaps_a.items():
        y = snaps_b.get(key)
        if x is not None and not torch.isfinite(x).all():
            bad.append("step %d %s of %s: not finite on FSDP2's side (the case compares nothing)" % key)
        elif (x is None) != (y is None):
            bad.append("step %d %s of %s: FSDP2 %s, bridge %s" % (key + ("none" if x is None else "set",
                                                                         "none" if y is None else "set")))
        elif x is not None and (x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y)):
            why = "shape %s vs %s" % (tuple(x.shape), tuple(y.shape)) if x.shape != y.shape else \
                "dtype %s vs %s" % (x.dtype, y.dtype) if x.dtype != y.dtype else \
                "max |diff| %g" % (x.double() - y.double()).abs().nan_to_num(float("inf")).max().item()
            bad.append("step %d %s of %s differs: %s" % (key + (why,)))
    grad_dtype = {u["name"]: u.get("grad_dtype") for u in pj["units"]}
    return dict(bad=bad, checked=len(snaps_a), grad_dtype=grad_dtype.get("inp"), par=par)


def worker(args):
    rank = H.init_rank()
    cases = all_cases()
    report = []
    for name in args.cases.split(","):
        dt, mode = cases[name]
        try:
            r = run_case(name, dt, mode, rank, args.steps)
        except Exception as e:  # noqa: BLE001 - one case's failure is reported, the others still run
            r = dict(bad=[H.failure(e)], checked=0, grad_dtype=None)
            report.append(r)
            break  # the ranks may now disagree on the collectives: stop here
        report.append(r)
    out = H.gather(report, WORLD)
    if rank != 0:
        return 0
    failed = 0
    names = args.cases.split(",")
    for i, name in enumerate(names):
        rows = [out[r][i] if i < len(out[r]) else None for r in range(WORLD)]
        if any(r is None for r in rows):
            print("FAIL %s: not run (an earlier case failed on some rank)" % name)
            failed += 1
            continue
        n_bad = sum(len(r["bad"]) for r in rows)
        failed += n_bad != 0
        dt, mode = cases[name]
        print("%s %s: params %s, param_dtype %s, reduce_dtype %s, %s (grad_dtype %s), %d steps: %s" % (
            "ok  " if n_bad == 0 else "FAIL", name, dt[0], dt[1] or "-", dt[2] or "-", mode, rows[0]["grad_dtype"],
            args.steps, "losses, sharded grads and parameters bit-identical to FSDP2 (%d tensors x ranks)"
            % sum(r["checked"] for r in rows) if n_bad == 0 else "%d differences" % n_bad))
        for rk, r in enumerate(rows):
            for x in r["bad"][:4]:
                print("  rank %d: %s" % (rk, x))
    print("bridge_dtypes_ranks: %d passed, %d failed" % (len(names) - failed, failed))
    return 0 if failed == 0 else 1


def main():
    ap = H.parser(__doc__)
    ap.add_argument("--cases", default=None, help="all, quick, or names (--list)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--list", action="store_true")
    args = H.parse(ap, worker)
    cases = all_cases()
    if args.list:
        print("\n".join(cases))
        return
    tier = os.environ.get("COMMPLAN_TEST_TIER", "full")
    sel = args.cases or ("quick" if tier == "quick" else "all")
    names = list(cases) if sel == "all" else QUICK if sel == "quick" else sel.split(",")
    unknown = [n for n in names if n not in cases]
    if unknown:
        sys.exit("test_bridge_dtypes: unknown case %s; --list names them" % unknown[0])
    steps = args.steps or STEPS["quick" if sel == "quick" else "full"]
    torchrun = H.torchrun_for(TAG, args.torchrun)
    bad = check_step_end_refused()
    print("%s step_end: the bridge refuses grad_accumulation = \"step_end\" with one line naming the plan%s"
          % ("ok  " if bad is None else "FAIL", "" if bad is None else ": " + bad))
    os.makedirs(os.path.join(REPO, BUILD), exist_ok=True)
    for n in names:
        write_plan(n, *cases[n], os.path.join(REPO, BUILD))
    H.build_all("test_bridge_dtypes", BUILD, [plan_name(n) for n in names])
    rc = H.launch(torchrun, __file__, WORLD, ["--worker", "--steps", steps, "--cases", ",".join(names)], 1800)
    if sel == "quick":
        print("quick tier: %d of the %d dtype x accumulation cases (%s: bf16 params, fp32 reduce; sync_last, reshard_after_forward = 2), %d "
              "steps; make test-full runs all %d (every dtype family x every, default, sync_last, noreshard, "
              "ar_last, sum, keep, prefetch), %d steps" % (
                  len(names), len(cases), ", ".join(names), steps, len(cases), STEPS["full"]))
    print("bridge_dtypes: %d cases %s, step_end refusal %s" % (
        len(names), "passed" if rc == 0 else "FAILED", "ok" if bad is None else "FAILED"))
    sys.exit(0 if rc == 0 and bad is None else 1)


if __name__ == "__main__":
    main()
