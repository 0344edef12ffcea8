"""Checkpoints between the bridge (commplan.runtime.CommplanFSDP over the plan's host library) and
PyTorch's FSDP2 (fully_shard), through torch.distributed.checkpoint (DCP), on gloo with 4 ranks
under torchrun (issue 36, item 3). The model is test_bridge_dtypes.py's (fp32: an uneven shard,
an empty one on rank 3, a root owning a parameter); AdamW; K steps, save, K more:

    fs_to_bridge   fully_shard (FSDP 4) trains K steps, DCP-saves model + optimizer
                   (get_state_dict); the bridge (plan dp_shard 4, its parameters perturbed first)
                   loads it (fsdp.state_dict() / commplan.checkpoint.optim_state_dict as dcp.load's
                   template) and trains K more: every loss, sharded gradient and parameter
                   bit-identical to fully_shard continuing from its own state
    bridge_to_fs   the reverse: the bridge trains K steps and saves (its steps are checked
                   against fully_shard's too); a fresh fully_shard model loads it (set_state_dict)
                   and trains K more, bit-identical to the bridge continuing
    resharded      fully_shard's FSDP 4 checkpoint into the bridge on HSDP 2x2 (plan dp_replicate 2
                   x dp_shard 2), bit-identical to fully_shard on HSDP 2x2 loading the same one
    dim1           the same checkpoint into the bridge with inp.weight sharded on dim 1 (plan
                   shard_dim; fully_shard's shard_placement_fn Shard(1)), against fully_shard so
                   sharded loading it
    form           one step each: the bridge's state_dict() and optim_state_dict() are what
                   get_state_dict gives on fully_shard (keys, DTensor placements, global shape and
                   stride, local tensors), FSDP 4, HSDP 2x2 and FSDP 4 with inp.weight on Shard(1);
                   a mesh of another shape refused in one line
    no_optim       the control: fs_to_bridge with the model loaded but not the optimizer state
                   (dcp.load given the model's template alone) must differ (the comparison can fail, and the optimizer state is what it holds)

    tests/python/test_bridge_checkpoint.py [TORCHRUN]

COMMPLAN_TEST_TIER=quick (make test) runs form on FSDP 4, fs_to_bridge, bridge_to_fs and no_optim
(one round trip each way and its control; a "quick tier:" line says so); full, or run by hand,
resharded, dim1 and form on HSDP 2x2 and Shard(1) too. Needs torch 2.x with FSDP2 and torchrun (make torch-env); anywhere else one SKIP line and exit 77.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

import bridge_harness as H  # noqa: E402
import test_bridge_dtypes as bd  # noqa: E402  (the model, its units and batches)

TAG = "bridge_checkpoint"
WORLD = 4
K = 2
BUILD = os.path.join("build", "bridge_ckpt")
PLANS = {"ck_fsdp": {"dp_shard": 4}, "ck_hsdp": {"dp_replicate": 2, "dp_shard": 2}, "ck_dim1": {"dp_shard": 4}}
# ck_dim1 shards inp.weight (13, 12) on dim 1 (FSDP2's shard_placement_fn Shard(1); 3 columns a
# rank: fully_shard refuses uneven shards on dim > 0, _fsdp_param.py _init_sharded_param)
SHARD_DIM = {"ck_dim1": {"inp.weight": 1}}
# make test's quick tier: the FSDP 4 plan alone (form on it, one round trip each way, the control)
QUICK_PLANS = ("ck_fsdp",)
CHECKS = ("form", "fs_to_bridge", "bridge_to_fs", "resharded", "dim1", "no_optim")
QUICK_CHECKS = ("form", "fs_to_bridge", "bridge_to_fs", "no_optim")


# ---- the ranks ----------------------------------------------------------------------------

def make_opt(model):
    import torch
    return torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3, weight_decay=0.1, foreach=False)


def train(model, opt, rank, steps, snaps):
    """steps [first, last): one micro-batch each; losses, local grads (before the update) and local
    parameters (after it)."""
    import torch
    import torch.nn.functional as F
    losses = []
    for s in steps:
        x, y = bd.batch(rank, s, 0, torch.float32)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.detach())
        for n, p in model.named_parameters():
            snaps[(s, "grad", n)] = None if p.grad is None else bd._local(p.grad).detach().clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for n, p in model.named_parameters():
            snaps[(s, "param", n)] = bd._local(p).detach().clone()
    snaps["loss"] = torch.stack(losses)
    return snaps


def perturbed():
    import torch
    m = bd.make_model("fp32")
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(0.5).add_(0.25)
    return m


def fully_sharded(mesh, model=None, plan=None):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    m = model if model is not None else bd.make_model("fp32")
    dims = {id(p): d for n, p in m.named_parameters() for k, d in SHARD_DIM.get(plan, {}).items() if n == k}
    fn = (lambda p: Shard(dims[id(p)]) if id(p) in dims else None) if dims else None
    for u in bd.units_of(m):
        fully_shard(u, mesh=mesh, shard_placement_fn=fn)
    fully_shard(m, mesh=mesh, shard_placement_fn=fn)
    return m


def bridge(plan, model):
    from commplan.match import find_plan_json, load_plan_json
    from commplan.runtime import CommplanFSDP, HostLibrary
    pj = load_plan_json(find_plan_json(plan, REPO))
    lib = HostLibrary(os.path.join(REPO, "build", plan, "lib%s.so" % plan), plan, plan_json=pj)
    return CommplanFSDP(plan, model, bd.units_of(model), root=REPO, library=lib, shard_dim=SHARD_DIM.get(plan))


def fs_save(m, opt, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(m, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)


def fs_load(m, opt, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    msd, osd = get_state_dict(m, opt)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(m, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def bridge_save(fsdp, opt, path):
    import torch.distributed.checkpoint as dcp
    from commplan.checkpoint import optim_state_dict
    dcp.save({"model": fsdp.state_dict(), "optim": optim_state_dict(fsdp, opt)}, checkpoint_id=path)


def bridge_load(fsdp, opt, path, optim=True):
    import torch.distributed.checkpoint as dcp
    from commplan.checkpoint import load_optim_state_dict, optim_state_dict
    # (the template's DTensors view the plan's shards and the optimizer's state tensors, so
    # dcp.load already writes them in place; the two loads below are what a copied template needs)
    sd = {"model": fsdp.state_dict()}
    if optim:
        sd["optim"] = optim_state_dict(fsdp, opt)
    dcp.load(sd, checkpoint_id=path)
    fsdp.load_state_dict(sd["model"])
    if optim:
        load_optim_state_dict(fsdp, opt, sd["optim"])


def compare(a, b):
    import torch
    bad = []
    if not torch.equal(a["loss"], b["loss"]):
        bad.append("losses differ: %s vs %s" % (a["loss"].tolist(), b["loss"].tolist()))
    for key, x in a.items():
        if key == "loss":
            continue
        y = b.get(key)
        if (x is None) != (y is None) or (x is not None and (x.shape != y.shape or not torch.equal(x, y))):
            bad.append("step %d %s of %s differs" % key)
    return bad, len(a) - 1


def worker(tmp):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    rank = H.init_rank()
    plans = QUICK_PLANS if H.QUICK else tuple(PLANS)
    fsdp_mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp_shard",))
    hsdp_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    first, then = range(K), range(K, 2 * K)
    ck_fs, ck_br = os.path.join(tmp, "fs"), os.path.join(tmp, "bridge")
    results = {}

    def case(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 -- reported per case
            results[name] = ([H.failure(e)], 0)

    # fully_shard: K steps, save, K more (the reference for fs_to_bridge and no_optim)
    a = fully_sharded(fsdp_mesh)
    opt_a = make_opt(a)
    head_a = train(a, opt_a, rank, first, {})
    fs_save(a, opt_a, ck_fs)
    ref_a = train(a, opt_a, rank, then, {})

    def fs_to_bridge(optim=True):
        b = perturbed()
        f = bridge("ck_fsdp", b)
        try:
            opt = make_opt(b)
            bridge_load(f, opt, ck_fs, optim)
            return compare(ref_a, train(b, opt, rank, then, {}))
        finally:
            f.close()

    def bridge_to_fs():
        c = bd.make_model("fp32")
        f = bridge("ck_fsdp", c)
        try:
            opt = make_opt(c)
            head = train(c, opt, rank, first, {})
            bad, n = compare(head_a, head)  # the bridge's own first steps: fully_shard's
            bridge_save(f, opt, ck_br)
            ref = train(c, opt, rank, then, {})
        finally:
            f.close()
        d = fully_sharded(fsdp_mesh, perturbed())
        opt_d = make_opt(d)
        fs_load(d, opt_d, ck_br)
        bad2, n2 = compare(ref, train(d, opt_d, rank, then, {}))
        return bad + bad2, n + n2

    def resharded(plan, mesh):
        e = fully_sharded(mesh, perturbed(), plan)
        opt_e = make_opt(e)
        fs_load(e, opt_e, ck_fs)
        ref = train(e, opt_e, rank, then, {})
        g = perturbed()
        f = bridge(plan, g)
        try:
            opt = make_opt(g)
            bridge_load(f, opt, ck_fs)
            return compare(ref, train(g, opt, rank, then, {}))
        finally:
            f.close()

    def form():
        """One step each from the same model: the bridge's model and optimizer state dicts are
        fully_shard's (get_state_dict): keys, DTensor or not, placements, global shape and stride,
        local tensors, on FSDP 4 and HSDP 2x2."""
        from commplan import PlanError
        from commplan.checkpoint import dp_mesh, optim_state_dict
        from torch.distributed.checkpoint.state_dict import get_state_dict
        bad, n = [], 0
        for plan, mesh in (("ck_fsdp", fsdp_mesh), ("ck_hsdp", hsdp_mesh), ("ck_dim1", fsdp_mesh)):
            if plan not in plans:
                continue
            x = fully_sharded(mesh, plan=plan)
            opt_x = make_opt(x)
            train(x, opt_x, rank, range(1), {})
            want = get_state_dict(x, opt_x)
            y = bd.make_model("fp32")
            f = bridge(plan, y)
            try:
                opt_y = make_opt(y)
                train(y, opt_y, rank, range(1), {})
                try:  # the other mesh: refused in one line naming the plan
                    dp_mesh(f, hsdp_mesh if mesh is fsdp_mesh else fsdp_mesh)
                    bad.append("%s: a state dict on the wrong mesh was made" % plan)
                except PlanError as e:
                    if "\n" in str(e) or plan not in str(e):
                        bad.append("%s: the wrong mesh refused with %r" % (plan, str(e)))
                got = (f.state_dict(), optim_state_dict(f, opt_y))
                # the model's DTensors view the plan's storage, which close() frees: copy them first
                got = ({k: v.clone() for k, v in got[0].items()}, got[1])
            finally:
                f.close()
            flat = [(plan + " model " + k, want[0][k], got[0].get(k)) for k in want[0]] + \
                [(plan + " optim %s.%s" % (k, sk), v, got[1]["state"].get(k, {}).get(sk))
                 for k, st in want[1]["state"].items() for sk, v in st.items()]
            if set(want[0]) != set(got[0]) or set(want[1]["state"]) != set(got[1]["state"]):
                bad.append("%s: keys %s vs %s" % (plan, sorted(want[0]), sorted(got[0])))
            if [g["params"] for g in want[1]["param_groups"]] != [g["params"] for g in got[1]["param_groups"]]:
                bad.append("%s: optimizer param_groups' FQNs differ" % plan)
            for key, a_, b_ in flat:
                n += 1
                da, db = hasattr(a_, "placements"), hasattr(b_, "placements")
                if b_ is None or da != db:
                    bad.append("%s: %s vs %s" % (key, type(a_).__name__, type(b_).__name__))
                elif da and (tuple(a_.placements) != tuple(b_.placements) or a_.shape != b_.shape
                             or a_.stride() != b_.stride() or tuple(a_.device_mesh.shape) != tuple(b_.device_mesh.shape)
                             or not torch.equal(a_.to_local(), b_.to_local())):
                    bad.append("%s: %s %s stride %s mesh %s vs %s %s stride %s mesh %s%s" % (
                        key, a_.placements, tuple(a_.shape), a_.stride(), tuple(a_.device_mesh.shape), b_.placements,
                        tuple(b_.shape), b_.stride(), tuple(b_.device_mesh.shape),
                        "" if torch.equal(a_.to_local(), b_.to_local()) else ", local tensors differ"))
                elif not da and not torch.equal(torch.as_tensor(a_), torch.as_tensor(b_)):
                    bad.append("%s differs" % key)
        return bad, n

    names = QUICK_CHECKS if H.QUICK else CHECKS
    checks = {"form": form, "fs_to_bridge": fs_to_bridge, "bridge_to_fs": bridge_to_fs,
              "resharded": lambda: resharded("ck_hsdp", hsdp_mesh), "dim1": lambda: resharded("ck_dim1", fsdp_mesh),
              "no_optim": lambda: fs_to_bridge(optim=False)}
    for name in names:
        case(name, checks[name])
    out = H.gather(results, WORLD)
    if rank != 0:
        return 0
    what = {"form": "the bridge's state_dict() and optim_state_dict() against get_state_dict on fully_shard",
            "fs_to_bridge": "fully_shard (FSDP 4) -> DCP -> bridge (FSDP 4)",
            "bridge_to_fs": "bridge (FSDP 4) -> DCP -> fully_shard (FSDP 4)",
            "resharded": "fully_shard (FSDP 4) -> DCP -> bridge (HSDP 2x2), vs fully_shard HSDP 2x2 loading it",
            "dim1": "fully_shard (FSDP 4) -> DCP -> bridge (FSDP 4, inp.weight on Shard(1)), vs fully_shard so "
                    "sharded loading it",
            "no_optim": "control: the model loaded without the optimizer state"}
    failed = 0
    for name in names:
        nbad = sum(len(out[r][name][0]) for r in range(WORLD))
        n = sum(out[r][name][1] for r in range(WORLD))
        if name == "no_optim":
            ok = nbad > 0 and not any("Error" in x for r in range(WORLD) for x in out[r][name][0][:1])
            print("%s %s: %s" % ("ok  " if ok else "FAIL", what[name], "differs from fully_shard continuing (%d "
                                 "differences), as it must" % nbad if ok else "did not differ"))
        else:
            ok = nbad == 0
            print("%s %s: %s" % ("ok  " if ok else "FAIL", what[name],
                                 "%s: keys, placements, shapes, strides and local tensors equal (%d entries x "
                                 "ranks)" % ("FSDP 4" if H.QUICK else "FSDP 4, HSDP 2x2, FSDP 4 with a Shard(1)", n)
                                 if ok and name == "form" else
                                 "%d steps continued, losses, sharded grads and parameters bit-identical "
                                 "(%d tensors x ranks)" % (K, n) if ok else "%d differences" % nbad))
            for r in range(WORLD):
                for x in out[r][name][0][:3]:
                    print("  rank %d: %s" % (r, x))
        failed += not ok
    print("bridge_checkpoint_ranks: %d passed, %d failed" % (len(names) - failed, failed))
    return 0 if failed == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("torchrun", nargs="?", help="torch's torchrun (default: beside this python)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.exit(worker(args.worker))
    torchrun = H.torchrun_for(TAG, args.torchrun, ("torch", "torch.distributed.fsdp", "torch.distributed.checkpoint"),
                              "torch with FSDP2 and DCP")
    models = {name: bd.make_model("fp32") for name in (QUICK_PLANS if H.QUICK else PLANS)}
    H.module_plans("test_bridge_checkpoint", BUILD, {name: (m, bd.units_of(m), dict(
        world_size=WORLD, parallel=dict(PLANS[name]), fsdp={"micro_steps": 1}, shard_dim=SHARD_DIM.get(name)))
        for name, m in models.items()})
    with tempfile.TemporaryDirectory(prefix="bridge-ckpt-") as tmp:
        rc = H.launch(torchrun, __file__, WORLD, ["--worker", tmp], 900)
    if H.QUICK:
        print("quick tier: %s on FSDP 4 (one DCP round trip each way and its control); make test-full adds resharded "
              "(FSDP 4 -> HSDP 2x2), dim1 (Shard(1)) and form on both" % ", ".join(QUICK_CHECKS))
    print("bridge_checkpoint: DCP round trips fully_shard <-> bridge (%s) %s" % (
        "same mesh both ways" if H.QUICK else "same mesh both ways, FSDP 4 -> HSDP 2x2, Shard(0) -> Shard(1)",
        "passed" if rc == 0 else "FAILED"))
    sys.exit(0 if rc == 0 else 1)


if __name__ == "__main__":
    main()
