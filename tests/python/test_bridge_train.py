"""The bridge's training-loop extras (issue 36; commplan.training) against PyTorch's own FSDP2
(fully_shard on gloo, 4 ranks under torchrun), FSDP (dp_shard 4) and HSDP (dp_replicate 2 x
dp_shard 2), bit for bit:

* gradient clipping by the global norm, as torchtitan clips (torchtitan/distributed/utils.py:599:
  get_total_norm over the DTensor gradients, full_tensor, clip_grads_with_norm_): the returned
  total norm and every clipped gradient shard equal to torch.nn.utils.clip_grad_norm_ on
  fully_shard's DTensors. Per step, a different entry point and norm on the bridge's side:
      step 0  CommplanFSDP.clip_grad_norm_, max_norm 1e3 (does not engage: coefficient 1)
      step 1  torch.nn.utils.clip_grad_norm_ on model.parameters() (the wrapped torch function)
              max_norm 0.05 (engages)
      step 2  commplan.training.clip_grad_norm_, inf norm, max_norm 0.01 (engages)
  and, as the mutant, this rank's local norm (what a plain clip on plain shards returned before)
  differs from FSDP2's on some rank, so the comparison can fail;
* an evaluation forward under torch.no_grad() before every step and under
  torch.inference_mode() after the last: outputs equal to fully_shard's, the following
  training step still bit-identical (losses, clipped gradients, parameters after AdamW);
* a torch clip mixing the bridge's gradients with another tensor's is refused in one line, and
  torch's clip of plain tensors stays torch's own while the bridge is open;
* the shard group the GPU library's path makes from plan.json's mesh has the host library's
  members (cp_hostlib_group_member);
* the order check still refuses an order the plan does not cover after an evaluation forward
  (a second training forward before backward);
* the plan's root: a plan found nowhere is refused with one line naming root= and every path
  searched (no torch processes).

    tests/python/test_bridge_train.py [TORCHRUN] [--steps N] [--meshes fsdp,hsdp]

COMMPLAN_TEST_TIER=quick (make test) runs HSDP alone (its "quick tier:" line says so); full, or
run by hand, FSDP and HSDP. Needs torch 2.x with FSDP2 and torchrun; anywhere else one SKIP line
and exit 77. Plain norms
and gradients compare bit for bit: the bridge runs torch's own get_total_norm on the same local
shards and the same reduction (x ** p, all-reduce SUM, x ** (1/p); MAX for inf) on the same
group size, so no tolerance is used.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

import bridge_harness as H  # noqa: E402

TAG = "bridge_train"
WORLD = 4
BUILD = os.path.join("build", "bridge_train")
MESHES = {"fsdp": {"dp_shard": 4}, "hsdp": {"dp_replicate": 2, "dp_shard": 2}}
QUICK_MESHES = ("hsdp",)
# step -> (entry point on the bridge's side, norm_type, max_norm)
CLIPS = [("method", 2.0, 1e3), ("torch", 2.0, 0.05), ("module", float("inf"), 0.01)]
# FSDP 4 has an empty shard (rank 3's out.weight), whose inf norm torch's _foreach_norm refuses
# (FSDP2 raises there): its third step clips by the 3-norm, and the inf reduction is checked on
# the parameters instead (the bridge's total_norm against the max of fully_shard's full tensors).
CLIPS_FSDP = CLIPS[:2] + [("module", 3.0, 0.01)]


def clips(mesh):
    return CLIPS_FSDP if mesh == "fsdp" else CLIPS


def plan_name(mesh):
    return "bt_" + mesh


def make_model():
    from test_bridge_dtypes import make_model as mm
    return mm("fp32")


def units_of(m):
    return [m.inp, m.mid, m.out]


def check_root_error():
    """The error for a plan found nowhere names root= and every path it searched."""
    import commplan
    from commplan.match import find_plan_json
    bad = []
    for root in (None, "/nonexistent-root"):
        try:
            find_plan_json("bt_no_such_plan", root)
            bad.append("root=%r: a missing plan was found" % root)
        except commplan.PlanError as e:
            msg = str(e)
            want = ["root=", os.path.join(root or os.getcwd(), "plans", "bt_no_such_plan", "plan.json"),
                    os.path.join(root or os.getcwd(), "build", "bt_no_such_plan", "gen", "plan.json")]
            if root is None:
                want.append(os.path.join(REPO, "plans", "bt_no_such_plan", "plan.json"))
            miss = [w for w in want if w not in msg]
            if miss or "\n" in msg or "run make" in msg:
                bad.append("root=%r: %r lacks %s" % (root, msg, miss or "one line"))
    # a plan under the checkout only is found from another working directory
    cwd = os.getcwd()
    try:
        os.chdir("/")
        path = find_plan_json("fsdp4")
        if path != os.path.join(REPO, "plans", "fsdp4", "plan.json"):
            bad.append("from /, fsdp4 resolved to %s" % path)
    except commplan.PlanError as e:
        bad.append("from /, fsdp4 not found: %s" % e)
    finally:
        os.chdir(cwd)
    return bad


# ---- the ranks ----------------------------------------------------------------------------

def batch(rank, step, micro):
    import torch
    g = torch.Generator().manual_seed(70_000 + 1000 * rank + 10 * step + micro)
    return torch.randn(4, 12, generator=g), torch.randn(4, 5, generator=g)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def run_side(model, rank, steps, clip, snaps):
    """Per step: an evaluation forward (no_grad), two micro-batches' forward/backward, the clip,
    AdamW; an inference_mode forward at the end. Records everything compared."""
    import torch
    import torch.nn.functional as F
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    for s in range(steps):
        with torch.no_grad():
            snaps[(s, "eval", "out")] = _local(model(batch(rank, s, 9)[0])).detach().clone()
        for k in range(2):
            x, y = batch(rank, s, k)
            loss = F.mse_loss(model(x), y) / 2
            loss.backward()
            snaps[(s, "loss", str(k))] = loss.detach().clone()
        total, local = clip(s)
        snaps[(s, "norm", "total")] = total.detach().clone()
        snaps[(s, "norm_local", "local")] = local
        for n, p in model.named_parameters():
            snaps[(s, "grad", n)] = _local(p.grad).detach().clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for n, p in model.named_parameters():
            snaps[(s, "param", n)] = _local(p).detach().clone()
    with torch.inference_mode():
        snaps[(steps, "eval", "inference_mode")] = _local(model(batch(rank, steps, 9)[0])).clone()
    if hasattr(model, "reshard"):  # fully_shard's root stays unsharded after a forward without backward
        model.reshard()


def run_case(mesh_kind, rank, steps):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import commplan
    import commplan.training as training
    from commplan.match import find_plan_json, load_plan_json
    from commplan.runtime import CommplanFSDP, HostLibrary, PlanOrderError
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard")) if mesh_kind == "hsdp" \
        else init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp_shard",))
    a = make_model()
    for m in units_of(a):
        fully_shard(m, mesh=mesh)
    fully_shard(a, mesh=mesh)

    def clip_a(s):
        _, p, mx = clips(mesh_kind)[s % 3]
        t = torch.nn.utils.clip_grad_norm_(a.parameters(), mx, p)
        return (t.full_tensor() if hasattr(t, "full_tensor") else t), None
    snaps_a, snaps_b = {}, {}
    run_side(a, rank, steps, clip_a, snaps_a)

    b = make_model()
    pn = plan_name(mesh_kind)
    pj = load_plan_json(find_plan_json(pn, REPO))
    lib = HostLibrary(os.path.join(REPO, "build", pn, "lib%s.so" % pn), pn, plan_json=pj)
    fsdp = CommplanFSDP(pn, b, units_of(b), root=REPO, library=lib)

    def clip_b(s):
        how, p, mx = clips(mesh_kind)[s % 3]
        grads = [q.grad for q in b.parameters() if q.grad is not None]
        local = training._ORIG["get_total_norm"](grads, p)  # the mutant: no reduction over the mesh
        if how == "method":
            t = fsdp.clip_grad_norm_(mx, p)
        elif how == "torch":
            t = torch.nn.utils.clip_grad_norm_(b.parameters(), mx, p)
        else:
            t = training.clip_grad_norm_(b.parameters(), mx, p)
        return t, local
    bad = []
    try:
        run_side(b, rank, steps, clip_b, snaps_b)
        # the inf reduction over empty shards: the bridge's total_norm of its parameters (equal
        # to fully_shard's after the steps) against the max over fully_shard's full tensors
        inf_b = training.total_norm(fsdp, [p.detach() for p in b.parameters()], float("inf"))
        inf_a = torch.stack([p.detach().full_tensor().abs().max() for p in a.parameters()]).max()
        if not torch.equal(inf_a, inf_b):
            bad.append("inf norm of the parameters: fully_shard %r, bridge %r" % (inf_a.item(), inf_b.item()))
        # a clip mixing the bridge's gradients with others is refused in one line (their norm
        # would be reduced as if sharded); torch's clip on other tensors stays torch's own
        x, y = batch(rank, 0, 0)
        torch.nn.functional.mse_loss(b(x), y).backward()
        extra = torch.nn.Parameter(torch.ones(3))
        extra.grad = torch.ones(3)
        try:
            torch.nn.utils.clip_grad_norm_(list(b.parameters()) + [extra], 1.0)
            bad.append("a clip mixing the bridge's gradients with another was accepted")
        except commplan.PlanError as e:
            if "\n" in str(e) or pn not in str(e):
                bad.append("the mixed clip's refusal: %r" % str(e))
        if not torch.equal(torch.nn.utils.clip_grad_norm_([extra], 1.0), torch.tensor(3.0).sqrt()):
            bad.append("torch's clip on a plain tensor changed while the bridge is open")
        for q in b.parameters():
            q.grad = None
        # the GPU library's groups (made from plan.json's mesh) are the host library's members
        fam = training._shard_family(pj)
        mine = [g for g in training._members_by_mesh(pj, fam) if lib.rank in g]
        color = [c for (fi, c) in lib._groups if fi == fam["id"]][0]
        if mine != [sorted(lib.group_members(fam["id"], color))]:
            bad.append("group from the mesh %s, the host library's %s" % (mine, lib.group_members(fam["id"], color)))
        # the order check still refuses what the plan does not cover, after evaluation
        try:
            x, _ = batch(rank, 0, 0)
            b(x)
            b(x)
            bad.append("a second training forward before backward was accepted")
        except PlanOrderError:
            pass
    finally:
        fsdp.close()
    # torch's get_total_norm is torch's again once the bridge is closed
    if torch.nn.utils.get_total_norm is not training._ORIG.get("get_total_norm", torch.nn.utils.get_total_norm):
        bad.append("torch.nn.utils.get_total_norm still wrapped after close()")
    checked = 0
    for key, x in snaps_a.items():
        if key[1] == "norm_local":
            continue
        y = snaps_b[key]
        checked += 1
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            why = "shape %s vs %s" % (tuple(x.shape), tuple(y.shape)) if x.shape != y.shape else \
                "dtype %s vs %s" % (x.dtype, y.dtype) if x.dtype != y.dtype else \
                "max |diff| %g" % (x.double() - y.double()).abs().max().item()
            bad.append("step %d %s of %s differs: %s" % (key + (why,)))
    engaged = [s for s in range(steps) if snaps_a[(s, "norm", "total")].item() > clips(mesh_kind)[s % 3][2]]
    local_differs = [s for s in range(steps)
                     if not torch.equal(snaps_b[(s, "norm_local", "local")], snaps_a[(s, "norm", "total")])]
    return dict(bad=bad, checked=checked, engaged=engaged, local_differs=local_differs)


def worker(args):
    if os.environ.get("BT_DEBUG"):
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["BT_DEBUG"]), exit=True)
    rank = H.init_rank()
    meshes = args.meshes.split(",")
    report = []
    for mesh in meshes:
        try:
            r = run_case(mesh, rank, args.steps)
        except Exception as e:  # noqa: BLE001 - reported; the ranks may disagree after it: stop
            import traceback
            traceback.print_exc()
            report.append(dict(bad=[H.failure(e)], checked=0, engaged=[], local_differs=[]))
            break
        report.append(r)
    out = H.gather(report, WORLD)
    if rank != 0:
        return 0
    failed = 0
    for i, mesh in enumerate(meshes):
        rows = [out[r][i] if i < len(out[r]) else None for r in range(WORLD)]
        if any(r is None for r in rows):
            print("FAIL %s: not run" % mesh)
            failed += 1
            continue
        n_bad = sum(len(r["bad"]) for r in rows)
        engaged = sorted(set(rows[0]["engaged"]))
        mutant = sorted({s for r in rows for s in r["local_differs"]})
        want_engaged = [s for s in range(args.steps) if clips(mesh)[s % 3][2] < 1]
        if engaged != want_engaged:
            rows[0]["bad"].append("clipping engaged in steps %s, expected %s" % (engaged, want_engaged))
            n_bad += 1
        if len(mutant) != args.steps:
            rows[0]["bad"].append("the local norm equals the global one in some step (%s of %d differ): the "
                                  "comparison would not catch a local clip" % (mutant, args.steps))
            n_bad += 1
        failed += n_bad != 0
        print("%s %s: %d steps (eval forward, 2 micro-batches, clip, AdamW), clipping engaged in steps %s: %s" % (
            "ok  " if n_bad == 0 else "FAIL", mesh, args.steps, engaged,
            "norms, clipped grads, parameters, losses and eval outputs bit-identical to FSDP2 (%d tensors x ranks);"
            " local norm differs in %d of %d steps" % (sum(r["checked"] for r in rows), len(mutant), args.steps)
            if n_bad == 0 else "%d differences" % n_bad))
        for rk, r in enumerate(rows):
            for x in r["bad"][:4]:
                print("  rank %d: %s" % (rk, x))
    print("bridge_train_ranks: %d passed, %d failed" % (len(meshes) - failed, failed))
    return 0 if failed == 0 else 1


def main():
    ap = H.parser(__doc__)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--meshes", default=",".join(QUICK_MESHES if H.QUICK else MESHES))
    args = H.parse(ap, worker)
    torchrun = H.torchrun_for(TAG, args.torchrun)
    meshes = H.pick("test_bridge_train", args.meshes, MESHES)
    bad = check_root_error()
    print("%s root: a plan found nowhere is refused naming root= and the paths searched; a checkout's plan is "
          "found from another directory%s" % ("ok  " if not bad else "FAIL", "" if not bad else ": " + "; ".join(bad)))
    models = {mesh: make_model() for mesh in meshes}
    H.module_plans("test_bridge_train", BUILD, {plan_name(mesh): (m, units_of(m), dict(
        world_size=WORLD, parallel=dict(MESHES[mesh]), fsdp={"micro_steps": 1})) for mesh, m in models.items()})
    rc = H.launch(torchrun, __file__, WORLD, ["--worker", "--steps", args.steps, "--meshes", ",".join(meshes)], 900)
    if H.QUICK and meshes == list(QUICK_MESHES):
        print("quick tier: HSDP 2 x 2 alone (its inf-norm clip), %d steps; make test-full runs FSDP 4 (an empty shard, "
              "the 3-norm) too" % args.steps)
    print("bridge_train: clipping and eval forwards on %s %s, root error %s" % (
        " and ".join(m.upper() for m in meshes), "passed" if rc == 0 else "FAILED", "ok" if not bad else "FAILED"))
    sys.exit(0 if rc == 0 and not bad else 1)


if __name__ == "__main__":
    main()
