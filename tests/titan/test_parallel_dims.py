#!/usr/bin/env python3
"""commplan's dims stage against torchtitan's own ParallelDims (issue 17, item 1).

For every mesh of world <= 64 (every factorization over dp_replicate,
dp_shard given or -1, cp, tp, pp, ep, and etp variants) and a set of
1,024-, 16,384- and 131,072-rank meshes, commplan's generator
(tests/titan/dims_dump.lua: gen/dims.lua's infer, gen/plan.lua's
check_supported, dims.mesh, gen/groups.lua; one Lua process for all) and
torchtitan.distributed.parallel_dims.ParallelDims (build_mesh over a fake
process group) must agree on accept or refuse. For every mesh both accept:
the resolved degrees, the mesh (names, sizes, strides of the dims > 1 of
torchtitan's dense mesh), with ep > 1 the expert mesh (those of its sparse
mesh (pp, dp_replicate, efsdp, ep)) and efsdp, every flattened alias and
every group family's rank lists (ep and efsdp among them) are equal (every
group of worlds <= 4,096; above, checksums over every group plus the groups
of 32 sample ranks). torchtitan's rank lists are the rows of each 1-D mesh's
layout over the world (the groups DeviceMesh creates), never process groups.

pp and ep are taken by commplan's dims (gen/parallel/pp.lua and ep.lua
refuse to generate tables later, in their rules, which dims_dump.lua does
not run): their meshes are compared like any other (pp since issue 22, ep
since issue 23: torchtitan 0.3's convention, ep borrowed from
dp_shard*cp*tp; docs/expert-parallel.md).

make test's quick tier (COMMPLAN_TEST_TIER=quick) takes the worlds <= 16 and
every large mesh, and says so in one "quick tier:" line; make test-full and a
run by hand, every world <= 64.

Verdicts:
  agreement      both accept with equal meshes, or both refuse;
  expected       torchtitan accepts a mesh with cp > 1 beside an ep that
                 neither divides nor is a multiple of cp x tp, which
                 commplan's check_supported refuses (gen/parallel/cp.lua's
                 check_dims: its runtime mesh refines the dense and expert
                 meshes, whose strides must nest); every other mesh with cp
                 (beside dp_replicate, dp_shard, tp, pp and ep) is compared
                 like any other and must be equal (FSDP's fsdp family,
                 dp_shard x cp, against torchtitan's fsdp mesh);
  etp-only       torchtitan accepts and commplan refuses only for etp
                 (parallel.etp): etp given with ep = 1, or an etp other than
                 1 with ep > 1 (torchtitan 0.3 has no etp setting at all:
                 its experts are never tensor-parallel with ep > 1);
  disagreement   anything else: the test fails and names the mesh.

Cost: every mesh commplan accepts is built by torchtitan on every run. The
verdicts of the meshes with pp / cp / ep that commplan refuses (~13,000
torchtitan builds, ~1.5 min of CPU) are torchtitan's own, memoized beside the torch
environment in ${COMMPLAN_CACHE:-${XDG_CACHE_HOME:-~/.cache}/commplan}/titan/
(outside the clone, so a clean clone reuses them) keyed by the sha256 of
torch's and torchtitan's versions, the source files that decide them
(parallel_dims.py, device_mesh.py, _mesh_layout.py) and the functions here
that build them; a cold cache rebuilds them. They can only move a refused
mesh between "refused by both" and "expected": no memoized verdict can
make this test pass or fail.
"""

import glob
import hashlib
import inspect
import json
import os
import sys
import time
from multiprocessing import get_context

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import titan_env as E  # noqa: E402

NAME = "ParallelDims agreement (tests/titan/test_parallel_dims.py)"
# make test (COMMPLAN_TEST_TIER=quick): every world up to 16, and the large meshes; make test-full
# (and by hand): every world up to 64.
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
MAX_WORLD = 16 if QUICK else 64
FULL = 4096  # as dims_dump.lua: worlds up to this compare every group's ranks
DEG = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh(w, dr, ds, cp=1, tp=1, pp=1, ep=1, etp=None):
    return {"world": w, "dp_replicate": dr, "dp_shard": ds, "cp": cp, "tp": tp, "pp": pp, "ep": ep, "etp": etp}


def small_meshes(max_world=64):
    """Every factorization of every world <= max_world (64) under either reading of ep:
    torchtitan 0.3's, which gen/dims.lua follows (dp_replicate*dp_shard*cp*tp*pp
    = world, ep dividing dp_shard*cp*tp, which it borrows from) and the seeds'
    (hyper_parallel's: ep multiplies the world; both refuse those); dp_shard
    given and -1; etp unset, and with ep > 1 a wrong one (tp + 1), and with
    dp_shard = -1 (cp = pp = 1) etp = 1 and etp = tp > 1, and etp = tp with ep = 1;
    plus refusals: degrees 0 and -1, dp_shard 0 and -2, a non-dividing
    dp_replicate, tp or ep, an ep past the world, a dp_shard that misses the
    world."""
    out = []
    for w in range(1, max_world + 1):
        D = divisors(w)
        for dr in D:
            for cp in D:
                for tp in D:
                    for pp in D:
                        base = dr * cp * tp * pp
                        if w % base:
                            continue
                        for ep in divisors(w // (dr * pp)):
                            dss = [-1, w // base]
                            if w % (base * ep) == 0 and w // (base * ep) not in dss:
                                dss.append(w // (base * ep))
                            for ds in dss:
                                etps = [None]
                                if ep > 1:
                                    etps.append(tp + 1)
                                    if ds == -1 and cp == pp == 1:
                                        etps += [1] + ([tp] if tp > 1 else [])
                                elif ds == -1 and cp == pp == 1:
                                    etps.append(tp)
                                for etp in etps:
                                    out.append(mesh(w, dr, ds, cp, tp, pp, ep, etp))
        for name in ("dp_replicate", "cp", "tp", "pp", "ep"):
            for bad in (0, -1):
                m = mesh(w, 1, -1)
                m[name] = bad
                out.append(m)
        out.append(mesh(w, 1, 0))
        out.append(mesh(w, 1, -2))
        out.append(mesh(w, 1, w + 1))
        nd = next(k for k in range(2, w + 2) if w % k)
        out.append(mesh(w, nd, -1))
        out.append(mesh(w, 1, -1, tp=nd))
        out.append(mesh(w, 1, -1, ep=nd))      # ep not dividing dp_shard*cp*tp: both refuse
        out.append(mesh(w, 1, -1, ep=2 * w))   # ep past it
    return out


def large_meshes():
    out = []
    for w in (1024, 16384, 131072):
        out += [
            mesh(w, 1, -1),                      # FSDP
            mesh(w, 16, -1, tp=8),               # HSDP + TP (llama70b's mesh at 1,024)
            mesh(w, w // 8, 1, tp=8),            # DDP + TP
        ]
        if w < 131072:  # each accepted 131,072-rank mesh costs ~0.4 s of checksums in Lua
            out += [
                mesh(w, w, 1),                   # DDP
                mesh(w, 8, -1),                  # HSDP
                mesh(w, 1, -1, tp=8),            # FSDP + TP
                mesh(w, 8, w // 64, tp=8),       # HSDP + TP given (llama405b's at 16,384)
            ]
        out += [
            mesh(w, 2, -1, cp=4, tp=8),          # an expected refusal: cp
            mesh(w, 1, -1, tp=8, pp=8),          # pp, ep: compared
            mesh(w, 1, -1, ep=8),
            mesh(w, 4, -1, tp=8, ep=16),
            mesh(w, 2, -1, tp=8, pp=4, ep=4),    # ep inside tp
            mesh(w, 1, w // 64, tp=8, ep=8),     # ep in the product (the seeds'): both refuse
            mesh(w, 3, -1),                      # refusals
            mesh(w, 1, w - 1),
            mesh(w, 1, -1, tp=w * 2),
        ]
    return out


def key(m):
    return tuple(m[k] for k in ("world",) + DEG)


def fmt(m):
    g = " ".join(f"{k}={m[k]}" for k in DEG if m[k] != 1 or k == "dp_shard")
    return f"world={m['world']} {g}" + (f" etp={m['etp']}" if m["etp"] is not None else "")


def commplan_side(meshes):
    lines = []
    for i, m in enumerate(meshes):
        f = [m[k] for k in DEG] + [m["etp"]]
        lines.append(f"{i} {m['world']} " + " ".join("-" if v is None else str(v) for v in f))
    out = E.lua(["tests/titan/dims_dump.lua"], "\n".join(lines) + "\n")
    res = [json.loads(s) for s in out.splitlines()]
    assert len(res) == len(meshes) and all(int(r["id"]) == i for i, r in enumerate(res)), "dims_dump.lua lost meshes"
    return res


# ---- torchtitan ----

def titan_validate(k):
    """torchtitan's ParallelDims(...) for key k without its meshes: its own
    degree checks and dp_shard = -1 inference (__post_init__). Returns
    (resolved key, None) or (None, why)."""
    from torchtitan.distributed.parallel_dims import ParallelDims
    w, dr, ds, cp, tp, pp, ep = k
    try:
        pd = ParallelDims(dp_replicate=dr, dp_shard=ds, cp=cp, tp=tp, pp=pp, ep=ep, world_size=w)
    except Exception as e:  # AssertionError / ValueError
        return None, _why(e)
    return (w, pd.dp_replicate, pd.dp_shard, pd.cp, pd.tp, pd.pp, pd.ep), None


def titan_build(k, backend="spmd_types"):
    """torchtitan's ParallelDims for key k with build_mesh(): (pd, None) or
    (None, why). The caller holds a fake process group of k[0] ranks."""
    from torchtitan.distributed.parallel_dims import ParallelDims
    w, dr, ds, cp, tp, pp, ep = k
    try:
        pd = ParallelDims(dp_replicate=dr, dp_shard=ds, cp=cp, tp=tp, pp=pp, ep=ep, world_size=w,
                          spmd_backend=backend)
        pd.build_mesh()
    except Exception as e:  # torchtitan refuses with AssertionError / ValueError / RuntimeError
        return None, _why(e)
    return pd, None


def _why(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _builds_worker(keys):
    """build_mesh verdicts on resolved keys: {"w dr ds cp tp pp ep": [accepted, why]},
    DeviceMesh without process groups (layouts only)."""
    E.cpu_titan()
    out = {}
    by_world = {}
    for k in keys:
        by_world.setdefault(k[0], []).append(k)
    with E.no_process_groups():
        for w, ks in sorted(by_world.items()):
            with E.fake_world(w):
                for k in ks:
                    pd, why = titan_build(k)
                    out[" ".join(map(str, k))] = [pd is not None, why]
    return out


def verdict_cache_path():
    import torch.distributed._mesh_layout as ml
    import torch.distributed.device_mesh as dm
    import torchtitan.distributed.parallel_dims as tpd
    h = hashlib.sha256()
    for v in E.versions():
        h.update(v.encode() + b"\0")
    for f in (tpd.__file__, dm.__file__, ml.__file__):
        with open(f, "rb") as fh:
            h.update(fh.read())
    for fn in (titan_build, _builds_worker, E.no_process_groups):
        h.update(inspect.getsource(fn).encode())
    # Beside the torch environment (tests/live/torch_env.sh), outside the clone: the verdicts are
    # torchtitan's alone (the key above), so a clean clone with that environment reuses them.
    cache = os.environ.get("COMMPLAN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "commplan")
    return os.path.join(cache, "titan", f"parallel_dims-verdicts-{h.hexdigest()[:16]}.json")


def memo_builds(keys):
    """build_mesh verdicts on resolved keys, memoized; returns (dict key -> [ok, why], built now)."""
    path = verdict_cache_path()
    cache = {}
    if os.path.exists(path):
        with open(path) as fh:
            cache = json.load(fh)
    missing = sorted(k for k in keys if " ".join(map(str, k)) not in cache)
    if missing:
        n = max(1, min(os.cpu_count() or 1, 8, len(missing) // 500 + 1))
        if n == 1:
            cache.update(_builds_worker(missing))
        else:
            with get_context("spawn").Pool(n) as pool:
                for part in pool.map(_builds_worker, [missing[i::n] for i in range(n)]):
                    cache.update(part)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(cache, fh, separators=(",", ":"))
        os.replace(tmp, path)
        for f in glob.glob(os.path.join(os.path.dirname(path), "parallel_dims-verdicts-*.json")):
            if f != path:  # memos of other torch / torchtitan sources
                os.remove(f)
    return {k: cache[" ".join(map(str, k))] for k in keys}, len(missing)


# ---- comparison of an accepted mesh ----

TITAN_NAME = {"dp": ("dp", "batch")}  # commplan family -> torchtitan 1-D meshes that must equal it


def titan_meshes(pd, legacy):
    """name -> 1-D DeviceMesh: the world, every single-axis mesh of the
    spmd_types backend (torchtitan's default), and the legacy backend's
    fsdp (dp_shard x cp, the mesh fully_shard gets there)."""
    t = dict(pd._single_axis_meshes)
    t["world"] = pd._world_mesh
    t["fsdp"] = legacy._single_axis_meshes["fsdp"]
    return t


def existing(pd, legacy):
    """torchtitan's enabled 1-D meshes (size > 1, a real backend), both backends."""
    return sorted(set(pd.get_all_one_dimensional_meshes()) | set(legacy.get_all_one_dimensional_meshes()))


def sample_ranks(w):
    out = []
    for r in [0, w - 1, w // 2] + [(i * 2654435761 + 12345) % w for i in range(1, 30)]:
        if r not in out:
            out.append(r)
    return out


def compare_groups(g, t, stats):
    """commplan family g (dims_dump.lua's JSON) against torchtitan's rank
    lists t ((groups, size) tensor); returns a problem or None."""
    import torch
    count, size = t.shape
    if (g["count"], g["size"]) != (count, size):
        return f"{g['name']}: commplan {g['count']} groups of {g['size']}, torchtitan {count} of {size}"
    stats["groups"] += count
    if "ranks" in g:
        tl = t.tolist()
        if tl == g["ranks"]:
            return None
        if sorted(map(tuple, tl)) == sorted(map(tuple, g["ranks"])):
            return f"{g['name']}: the same groups in another order (commplan {g['ranks'][:3]}..., torchtitan {tl[:3]}...)"
        bad = next(i for i in range(count) if tl[i] != g["ranks"][i])
        return f"{g['name']}: group {bad} is {g['ranks'][bad][:16]} in commplan, {tl[bad][:16]} in torchtitan"
    t = t.to(torch.int64)  # the rank map may be int32: r * r must not wrap at 2^32
    k = torch.arange(1, size + 1, dtype=torch.int64)
    c = torch.arange(1, count + 1, dtype=torch.int64)[:, None]
    sums = (int((t * k).sum()), int((t * t * k * k).sum()), int((t * c * k).sum()))
    if sums != (g["s1"], g["s2"], g["s3"]):
        return f"{g['name']}: checksums over every group differ (commplan {g['s1'], g['s2'], g['s3']}, torchtitan {sums})"
    where = torch.empty(count * size, dtype=torch.int64)  # rank -> its group's row
    where[t.flatten()] = torch.arange(count, dtype=torch.int64).repeat_interleave(size)
    for r, head, tail in g["samples"]:
        row = t[where[r]].tolist()
        if row[:32] != head or row[max(32, size - 32):] != tail:
            return f"{g['name']}: the group of rank {r} is {head[:8]}... in commplan, {row[:8]}... in torchtitan"
    return None


def compare_accepted(m, c, pd, legacy, stats, lists):
    """lists: torchtitan's rank lists by mesh name, shared by the meshes of one build."""
    problems = []
    for n in DEG:
        if getattr(pd, n) != c["degrees"][n]:
            problems.append(f"{n}: commplan {c['degrees'][n]}, torchtitan {getattr(pd, n)}")
    dense = pd._global_meshes["dense"]
    tmesh = [(n, ax.shape[0], ax.stride[0]) for n, ax in zip(dense.mesh_dim_names, dense._layout) if ax.numel() > 1]
    cm = c["mesh"]
    cmesh = [tuple(x) for x in zip(cm["names"], cm["sizes"], cm["strides"]) if x[1] > 1]
    if tmesh != cmesh:
        problems.append(f"mesh (name, size, stride): commplan {cmesh}, torchtitan's dense mesh {tmesh}")
    if pd.ep > 1:
        stats["ep_meshes"] += 1
        sparse = pd._global_meshes["sparse"]
        tsp = [(n, ax.shape[0], ax.stride[0]) for n, ax in zip(sparse.mesh_dim_names, sparse._layout)
               if ax.numel() > 1]
        cs = c.get("sparse") or {"names": [], "sizes": [], "strides": []}
        csp = [tuple(x) for x in zip(cs["names"], cs["sizes"], cs["strides"]) if x[1] > 1]
        if tsp != csp:
            problems.append(f"expert mesh (name, size, stride): commplan {csp}, torchtitan's sparse mesh {tsp}")
        tefsdp = pd._single_axis_meshes["efsdp"].size()
        if c["degrees"]["efsdp"] != tefsdp:
            problems.append(f"efsdp: commplan {c['degrees']['efsdp']}, torchtitan {tefsdp}")
    elif "sparse" in c:
        problems.append(f"commplan has an expert mesh {c['sparse']} with ep = 1")
    tm = titan_meshes(pd, legacy)
    mine = {g["name"]: g for g in c["groups"]}
    for g in c["groups"]:
        for tn in TITAN_NAME.get(g["name"], (g["name"],)):
            if tn not in tm:
                problems.append(f"{g['name']}: torchtitan has no mesh {tn}")
                continue
            if tn not in lists:
                lists[tn] = E.rank_lists(tm[tn])
            p = compare_groups(g, lists[tn], stats)
            stats["families"] += 1
            stats["ep_families"] += g["name"] in ("ep", "efsdp")
            if p:
                problems.append(p + (f" (torchtitan's {tn})" if tn != g["name"] else ""))
    back = {"batch": "dp"}
    for tn in existing(pd, legacy):
        if back.get(tn, tn) not in mine:
            problems.append(f"torchtitan's mesh {tn} (size {tm[tn].size()}) has no commplan group family")
    stats["aliases"] += len(c["aliases"])
    return problems


def main():
    E.need_titan(NAME)
    t0 = time.time()
    meshes = small_meshes(MAX_WORLD) + large_meshes()
    mine = commplan_side(meshes)
    t_lua = time.time() - t0

    # torchtitan, step 1: ParallelDims(...) for every distinct configuration
    # (its degree checks and dp_shard = -1 inference; no mesh yet).
    tkeys = sorted({key(m) for m in meshes}, key=lambda k: tuple(-9 if v is None else v for v in k))
    validated = {k: titan_validate(k) for k in tkeys}
    # Step 2: build_mesh() on every resolved configuration that passed. It
    # reads only the resolved degrees, so dp_shard = -1 and the dp_shard it
    # infers share one build. Those with pp, cp or ep > 1 that commplan
    # refuses (every one with cp) are memoized; the rest are built now, with
    # both backends, and those commplan accepts compared below.
    resolved = {r for r, _ in validated.values() if r is not None}
    by_resolved = {}  # the meshes commplan accepts, by torchtitan's resolved configuration
    for i, c in enumerate(mine):
        r = validated[key(meshes[i])][0]
        if c["ok"] and r is not None:
            by_resolved.setdefault(r, []).append(i)
    memo_keys = {r for r in resolved if (r[3] > 1 or r[5] > 1 or r[6] > 1) and r not in by_resolved}
    memo, built_now = memo_builds(memo_keys)
    t_memo = time.time() - t0 - t_lua

    stats = {"groups": 0, "families": 0, "aliases": 0, "ep_meshes": 0, "ep_families": 0}
    problems, bad = [], set()
    live = {}  # resolved key -> (pd, legacy) or (None, why)
    for w in sorted({r[0] for r in resolved - memo_keys}):
        # Real fake-PG groups up to 16 ranks; above, the layouts alone.
        with E.fake_world(w), (E.no_process_groups() if w > 16 else _null()):
            for r in sorted(x for x in resolved - memo_keys if x[0] == w):
                pd, why = titan_build(r)
                if pd is None:
                    live[r] = (None, why)
                    continue
                with E.no_process_groups():  # only its fsdp mesh's layout is read
                    legacy, why = titan_build(r, "partial_dtensor")
                assert legacy is not None, why
                live[r] = (pd, legacy)
                # compare every commplan-accepted mesh that resolves to r
                lists = {}
                for i in by_resolved.get(r, ()):
                    ps = compare_accepted(meshes[i], mine[i], pd, legacy, stats, lists)
                    if ps:
                        problems.append(f"{fmt(meshes[i])}: " + "; ".join(ps))
                        bad.add(i)

    def verdict(m):
        r, why = validated[key(m)]
        if r is None:
            return False, why
        if r in memo:
            return tuple(memo[r])
        return (live[r][0] is not None), (None if live[r][0] is not None else live[r][1])

    both_accept = both_refuse = etp_only = n_expected = 0
    expected = {"pp": 0, "ep": 0}  # cp refusals that also have pp / ep
    ep_accept = ep_refuse = 0  # meshes with ep > 1 both accept (equal) / both refuse
    for i, (m, c) in enumerate(zip(meshes, mine)):
        ok, why = verdict(m)
        if c["ok"]:
            if not ok:
                problems.append(f"{fmt(m)}: commplan accepts, torchtitan refuses ({why})")
            elif i not in bad:
                both_accept += 1
                ep_accept += m["ep"] > 1
        elif not ok:
            both_refuse += 1
            ep_refuse += m["ep"] > 1
        elif m["cp"] > 1 and c["stage"] == "supported" and ": parallel.cp: " in c["msg"]:
            n_expected += 1
            for f in expected:
                expected[f] += m[f] > 1
        elif m["etp"] is not None and ": parallel.etp: " in c["msg"]:
            etp_only += 1
        else:
            problems.append(f"{fmt(m)}: torchtitan accepts, commplan refuses: {c['msg']}")

    for p in problems[:40]:
        print("DISAGREE", p)
    if len(problems) > 40:
        print(f"... and {len(problems) - 40} more")
    big = sorted({m["world"] for m in meshes if m["world"] > 64})
    tv, ttv = E.versions()
    print(f"parallel_dims: commplan {t_lua:.1f} s (one Lua process for every mesh); torchtitan {tv} / {ttv}: "
          f"{len(tkeys)} configurations through ParallelDims(), {len(resolved)} resolved ones through build_mesh(): "
          f"{len(resolved - memo_keys)} now (both backends), {len(memo_keys)} with pp/cp/ep memoized in "
          f"{os.path.dirname(verdict_cache_path())}/ "
          f"({built_now} built this run, {time.time() - t0 - t_lua:.1f} s)")
    print(f"parallel_dims: {both_accept} meshes accepted by both and equal: degrees, mesh, {stats['aliases']} flattened "
          f"aliases, {stats['families']} group families, {stats['groups']} groups' rank lists")
    print(f"parallel_dims: ep (torchtitan 0.3's: borrowed from dp_shard*cp*tp): {ep_accept} meshes with ep > 1 "
          f"accepted by both and equal ({stats['ep_meshes']} compared: dense and expert meshes, efsdp, "
          f"{stats['ep_families']} ep / efsdp group families among the rest), {ep_refuse} refused by both (the seeds' "
          f"reading, ep multiplying the world, among them)")
    print(f"parallel_dims: {len(meshes)} meshes (worlds 1..{MAX_WORLD}: {sum(m['world'] <= 64 for m in meshes)}; "
          f"{', '.join(map(str, big))}: {sum(m['world'] > 64 for m in meshes)}): {both_accept} accepted, "
          f"{both_refuse} refused by both, {n_expected} expected refusals (cp beside a non-nesting ep: the runtime's mesh; with pp {expected['pp']}, "
          f"with ep {expected['ep']}), {etp_only} etp-only refusals (torchtitan 0.3 has no etp), "
          f"{len(problems)} disagreements")
    if QUICK:
        print(f"quick tier: worlds 1..{MAX_WORLD} ({sum(m['world'] <= 64 for m in meshes)} of {len(small_meshes())} "
              f"meshes of worlds up to 64) and the {sum(m['world'] > 64 for m in meshes)} large ones; make test-full runs "
              f"every world up to 64")
    return 1 if problems else 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    sys.exit(main())
