"""The bridge's overlap (issue 36, item 1; commplan.overlap): CommplanFSDP over the host library
makes the library's split calls (cp_hostlib_unshard_issue / _wait, cp_hostlib_reduce_issue /
_wait) at the places of the plan's op order, its collectives asynchronous on gloo, against
PyTorch's own FSDP2 (fully_shard on gloo, 4 ranks under torchrun), FSDP (dp_shard 4) and HSDP
(dp_replicate 2 x dp_shard 2), 3 steps x 2 micro-batches of AdamW:

* every loss, every sharded gradient and every parameter after each step bit-identical to
  fully_shard's;
* the prefetch is really issued ahead: in one log of the bridge's calls and the host library's
  asynchronous collectives (issued with a ticket, waited for by ticket), some unit's all-gather is
  issued in its neighbour's pre-backward and still in flight when that neighbour's backward ends
  (its reshard), waited for only at the unit's own unshard_wait; and some unit's reduce-scatter is
  still in flight when the next unit's backward ends;
  (and none once the bridge's prefetches are taken out: the mutant the count must tell apart);
* recovery (commplan.recovery): before the last step, micro-batch 0's backward raises in the mid
  unit's backward with collectives in flight (the bridge's synchronize leaves none: HostLibrary.
  synchronize drains them), then a forward raises inside mid's forward; the root's next forward
  resets the step each time, and the step made again is bit-identical to fully_shard's;
* the calls are one grouping of the plan's ops (runtime.group_calls) with two kinds tables;
* the order check is kept: with the bridge's own order check bypassed, the next unit's unshard
  issued at the step's start before the root's is waited for is refused by the library with its
  one line on every rank, before anything is issued.

    tests/python/test_bridge_overlap.py [TORCHRUN] [--steps N] [--meshes fsdp,hsdp]

COMMPLAN_TEST_TIER=quick (make test) runs HSDP alone (and says so in a "quick tier:" line); full,
or run by hand, FSDP and HSDP. Needs torch 2.x with FSDP2 and torchrun; anywhere else one SKIP
line and exit 77.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

import bridge_harness as H  # noqa: E402

TAG = "bridge_overlap"
WORLD = 4
BUILD = os.path.join("build", "bridge_overlap")
MESHES = {"fsdp": {"dp_shard": 4}, "hsdp": {"dp_replicate": 2, "dp_shard": 2}}
QUICK_MESHES = ("hsdp",)


def plan_name(mesh):
    return "bo_" + mesh


def make_model():
    from test_bridge_dtypes import make_model as mm
    return mm("fp32")


def units_of(m):
    return [m.inp, m.mid, m.out]


def batch(rank, step, micro):
    import torch
    g = torch.Generator().manual_seed(80_000 + 1000 * rank + 10 * step + micro)
    return torch.randn(4, 12, generator=g), torch.randn(4, 5, generator=g)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class Boom(RuntimeError):
    """The exception raised inside a unit's forward (the recovery check)."""


def run_side(model, rank, steps, snaps, fail=None):
    """fail: (step, fsdp, info): before that step, micro-batch 0's backward raising in mid's
    backward (a prefetched all-gather and a reduction in flight: the bridge's synchronize must
    leave none), then a forward raising inside mid's forward, the gradients zeroed: the step is
    then made in full, each forward after an unfinished pass reset by the bridge (commplan.recovery)."""
    import torch
    import torch.nn.functional as F
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    for s in range(steps):
        if fail is not None and s == fail[0]:
            fsdp, info = fail[1], fail[2]
            x, y = batch(rank, s, 0)

            def boom_bwd(grad):  # after the bridge's pre-backward of mid (its prefetch issued)
                info["in_flight"] = len(fsdp.lib._async.pending)
                fsdp.synchronize()
                info["after_sync"] = len(fsdp.lib._async.pending)
                raise Boom("raised in mid's backward")
            h = model.mid.register_forward_hook(lambda m, a, out: [out.register_hook(boom_bwd), None][1])
            try:
                (F.mse_loss(model(x), y) / 2).backward()
            except Boom:
                info["raised"] = 1
            h.remove()

            def boom(module, args):
                raise Boom("raised inside mid's forward")
            h = model.mid.register_forward_pre_hook(boom)
            try:
                model(batch(rank, s, 1)[0])
            except Boom:
                info["raised"] += 1
            h.remove()
            opt.zero_grad(set_to_none=True)
        for k in range(2):
            x, y = batch(rank, s, k)
            loss = F.mse_loss(model(x), y) / 2
            loss.backward()
            snaps[(s, "loss", str(k))] = loss.detach().clone()
        for n, p in model.named_parameters():
            snaps[(s, "grad", n)] = _local(p.grad).detach().clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for n, p in model.named_parameters():
            snaps[(s, "param", n)] = _local(p).detach().clone()


CALLS = ("unshard_issue", "unshard_wait", "reduce_issue", "reduce_wait")


def in_flight(log):
    """(prefetches, reductions) from one log of the bridge's calls (logged when the call returns)
    and the host library's tickets ("issue" when handed out, "wait" when waited for): all-gathers
    an unshard_issue handed out that were still in flight when another unit's post-backward
    reduced (its backward had ended) and were waited for only by the unit's own unshard_wait; and
    reduce-scatters still in flight until the next unit's post-backward (waited there, as the
    plan's pack waits for the previous reduce-scatter: FSDP2's post_backward)."""
    pre = red = 0
    calls = [i for i, e in enumerate(log) if e[0] in CALLS]
    for n, i in enumerate(calls):
        call, unit = log[i]
        if call not in ("unshard_issue", "reduce_issue"):
            continue
        start = calls[n - 1] + 1 if n else 0
        tickets = [log[j][1] for j in range(start, i) if log[j][0] == "issue"]
        if not tickets:
            continue
        w = next((j for j in range(i + 1, len(log)) if log[j] == ("wait", tickets[0])), None)
        during = next((log[j] for j in calls if w is not None and j > w), None)
        if w is None or during is None:
            continue
        if call == "unshard_issue":
            crossed = [log[j] for j in calls if i < j < w and log[j][0] == "reduce_issue" and log[j][1] != unit]
            pre += bool(crossed) and during == ("unshard_wait", unit)
        else:
            red += during[0] == "reduce_issue" and during[1] != unit
    return pre, red


def run_case(mesh_kind, rank, steps):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from commplan.match import find_plan_json, load_plan_json
    from commplan.runtime import CommplanFSDP, HostLibrary
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard")) if mesh_kind == "hsdp" \
        else init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp_shard",))
    a = make_model()
    for u in units_of(a):
        fully_shard(u, mesh=mesh)
    fully_shard(a, mesh=mesh)
    snaps_a = {}
    run_side(a, rank, steps, snaps_a)

    name = plan_name(mesh_kind)
    pj = find_plan_json(name, REPO)
    lib = HostLibrary(os.path.join(REPO, "build", name, "lib%s.so" % name), name, load_plan_json(pj))
    b = make_model()
    fsdp = CommplanFSDP(name, b, units_of(b), root=REPO, library=lib)
    bad = []
    if fsdp._overlap is None or lib._async is None:
        bad.append("the bridge made no split calls (overlap off or the library without them)")
        return dict(bad=bad, checked=0, pre=0, red=0, refused="", pre_mutant=-1)
    # one grouping of the plan's ops into calls (runtime.group_calls), the kinds table apart
    from commplan.overlap import SPLIT_KINDS, split_calls
    from commplan.runtime import CALL_KINDS, group_calls, library_calls
    plan = load_plan_json(pj)
    if split_calls(plan) != group_calls(plan, SPLIT_KINDS) or \
            library_calls(plan) != [c[:4] for c in group_calls(plan, CALL_KINDS.items())]:
        bad.append("split_calls / library_calls are not runtime.group_calls with their kinds table")
    log = []
    fsdp._overlap.log = lib._async.log = log
    snaps_b = {}
    info = {}
    run_side(b, rank, steps, snaps_b, fail=(steps - 1, fsdp, info))
    if info.get("raised") != 2 or info.get("in_flight", 0) == 0 or info.get("after_sync") != 0:
        bad.append("recovery: %s of 2 exceptions raised (backward, forward); %s collectives in flight in mid's "
                   "backward, %s left after synchronize (want > 0, 0)" % (info.get("raised"), info.get("in_flight"),
                                                                            info.get("after_sync")))
    pre, red = in_flight(log)
    if os.environ.get("BO_DEBUG") and rank == 0:
        print("log:", log)
    checked = 0
    for key, va in snaps_a.items():
        vb = snaps_b.get(key)
        checked += 1
        if vb is None or va.shape != vb.shape or not torch.equal(va, vb):
            bad.append("step %d %s %s differs" % key)

    # the mutant: the same bridge with its prefetches taken out (each unshard issued in its own
    # pre-hook): the log must show no all-gather in flight across a neighbour's backward
    lib_m = HostLibrary(os.path.join(REPO, "build", name, "lib%s.so" % name), name, load_plan_json(pj))
    c = make_model()
    fsdp_m = CommplanFSDP(name, c, units_of(c), root=REPO, library=lib_m, check_order=False)
    fsdp_m._overlap.compute = {}
    log_m = []
    fsdp_m._overlap.log = lib_m._async.log = log_m
    try:
        run_side(c, rank, 1, {})
    except RuntimeError:  # the library may refuse the later issue (bytes the plan's order freed): no prefetch
        pass
    pre_mutant = in_flight(log_m)[0]
    fsdp_m.close()

    # a wrong order through the library itself (the bridge's own order check bypassed): at the
    # step's start the next unit's unshard issued before the root's is waited for (copied out)
    refused = ""
    lib.call("unshard_issue", 0)
    try:
        lib.call("unshard_issue", 1)
    except RuntimeError as e:
        refused = str(e)
    fsdp.close()
    return dict(bad=bad, checked=checked, pre=pre, red=red, refused=refused, pre_mutant=pre_mutant,
                in_flight=info.get("in_flight", 0))


def worker(args):
    rank = H.init_rank()
    meshes = args.meshes.split(",")
    report = []
    for mesh in meshes:
        try:
            r = run_case(mesh, rank, args.steps)
        except Exception as e:  # noqa: BLE001 - reported; the ranks may disagree after it: stop
            import traceback
            traceback.print_exc()
            report.append(dict(bad=[H.failure(e)], checked=0, pre=0, red=0, refused="", pre_mutant=-1))
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
        bad = [x for r in rows for x in r["bad"]]
        pre, red = min(r["pre"] for r in rows), min(r["red"] for r in rows)
        if not pre or not red:
            bad.append("not overlapped: %d all-gathers in flight across a neighbour's backward, %d reduce-scatters "
                       "across the next backward (each must be > 0 on every rank)" % (pre, red))
        if any(r["pre_mutant"] != 0 for r in rows):
            bad.append("the mutant without prefetches still counts %s prefetches: the count cannot fail"
                       % [r["pre_mutant"] for r in rows])
        ref = [r["refused"] for r in rows]
        if not all("cp_hostlib_unshard_issue(inp)" in m and "SCHEDULE.md" in m and "\n" not in m for m in ref):
            bad.append("an unshard issued before the previous one's wait was not refused on every rank with one "
                       "line: %r" % ref[0])
        failed += bool(bad)
        print("%s %s: %d steps x 2 micro-batches through the split calls, losses, grads and parameters bit-identical "
              "to FSDP2 (%d tensors x ranks); per rank >= %d all-gathers prefetched in flight across a neighbour's "
              "backward (0 without the prefetches), >= %d reduce-scatters across the next backward; after exceptions in a "
              "unit's backward (>= %d collectives in flight, drained by synchronize) and forward the step again bit-identical; an "
              "early issue refused: %s" % (
                  "ok  " if not bad else "FAIL", mesh, args.steps, sum(r["checked"] for r in rows), pre, red,
                  min(r.get("in_flight", 0) for r in rows),
                  ref[0].split(": ", 1)[-1][:200]))
        for x in bad[:6]:
            print("  %s" % x)
    print("bridge_overlap_ranks: %d passed, %d failed" % (len(meshes) - failed, failed))
    return 0 if failed == 0 else 1


def main():
    ap = H.parser(__doc__)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--meshes", default=",".join(QUICK_MESHES if H.QUICK else MESHES))
    args = H.parse(ap, worker)
    torchrun = H.torchrun_for(TAG, args.torchrun)
    meshes = H.pick("test_bridge_overlap", args.meshes, MESHES)
    models = {mesh: make_model() for mesh in meshes}
    H.module_plans("test_bridge_overlap", BUILD, {plan_name(mesh): (m, units_of(m), dict(
        world_size=WORLD, parallel=dict(MESHES[mesh]), fsdp={"micro_steps": 2})) for mesh, m in models.items()})
    rc = H.launch(torchrun, __file__, WORLD, ["--worker", "--steps", args.steps, "--meshes", ",".join(meshes)], 900)
    if H.QUICK and meshes == list(QUICK_MESHES):
        print("quick tier: HSDP 2 x 2 alone, %d steps; make test-full runs FSDP 4 too" % args.steps)
    print("bridge_overlap: %s %s" % (" and ".join(m.upper() for m in meshes), "passed" if rc == 0 else "FAILED"))
    sys.exit(0 if rc == 0 else 1)


if __name__ == "__main__":
    main()
