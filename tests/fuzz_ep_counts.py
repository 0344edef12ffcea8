"""Fuzzing expert parallelism's counts where they enter the libraries: the C call
(cp_hostlib_set_expert_counts through ctypes, int64 counts and a length) and Python's
HostLibrary.set_expert_counts (python/commplan/runtime.py), with hostile counts: floats (2.5,
nan, inf), bools, negatives, 2^63 and 2^64+1, numpy and torch scalars and tensors, lists too
long or too short, a member's share past the capacity, wrong units, NULL.

Each case runs on every rank of a 4-rank EP plan (tests/ep/plans/ep2_mixtral.lua) on gloo: one
rank (the case's) sets the hostile counts, the others valid ones, then every rank makes the
unit's exchange. The contract, per case:

  accepted  only counts that are exact integers in range: the counts the exchange split by
            (exchange_counts) equal them, value for value (never wrapped, truncated or rounded);
            counts that are integers in range given as ints (Python, numpy, torch) are accepted;
  refused   everything else, with a clear error (False, or an exception, with one line from
            last_error), and the rank still joins the exchange: the exchange then raises on
            every member of its ep group (one line), none left waiting, none let through.

Case I depends only on (seed, I): a failure reproduces with --seed N --only I. The closing line
counts the cases per surface.

    tests/fuzz_ep_counts.py [--seconds 20] [--min-cases 200] [--seed N] [--only I]

Needs torch with torch.distributed (gloo); anywhere else one SKIP line and exit 77.
"""
import argparse
import ctypes
import fractions
import json
import os
import random
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

PLAN = "ep2_mixtral"
WORLD = 4
OUT = os.path.join("build", "ep", "lib")  # tests/python/ep_library.py's tree: built once for both
I64_MAX = (1 << 63) - 1


def skip(why):
    print("SKIP fuzz_ep_counts: %s" % why)
    sys.exit(77)


# ---- the cases --------------------------------------------------------------------------------

def valid_counts(rng, E, epp, cap):
    """Tokens per global expert, each member's share within its capacity."""
    out = []
    for _ in range(E // epp):
        left = rng.choice([cap, rng.randrange(cap + 1)])
        for e in range(epp):
            c = left if e == epp - 1 and rng.random() < 0.5 else rng.randrange(left + 1)
            out.append(c)
            left -= c
    return out


def hostile_python(rng, base, E, epp, cap, np, torch):
    """(counts as given, how, the exact integers they stand for or None, must_accept)."""
    v = list(base)
    i = rng.randrange(E)
    k = rng.randrange(18)
    if k == 0:
        return v, "valid ints", v, True
    if k == 1:
        v[i] = 2.5
        return v, "2.5", None, False
    if k == 2:
        v[i] = float(base[i])
        return v, "an integral float", base, False
    if k == 3:
        v[i] = bool(base[i] & 1)
        return v, "a bool", [int(x) for x in v], False
    if k == 4:
        v[i] = rng.choice([-1, -(1 << 31), -(1 << 63), -(1 << 64) - 1])
        return v, "negative %d" % v[i], v, False
    if k == 5:
        v[i] = rng.choice([(1 << 64) + 1, (1 << 64) + base[i], 1 << 63, 1 << 64, (1 << 32) + base[i], I64_MAX, 10 ** 30, 1 << 20000])
        shown = "%d" % v[i] if v[i] < 10 ** 30 else "an integer of %d bits" % v[i].bit_length()
        return v, "%s (past int64 or the capacity)" % shown, v, False
    if k == 6:
        v[i] = cap + 1 + rng.randrange(4)
        return v, "a member's share past the capacity %d" % cap, v, False
    if k == 7:
        t = rng.choice([np.int64, np.int32, np.int16, np.uint8, np.uint64])
        return [t(x) for x in v], "numpy %s" % t.__name__, v, True
    if k == 8:
        v2 = [np.int64(x) for x in v]
        v2[i] = rng.choice([np.float64(2.5), np.float32(0.5), np.uint64((1 << 64) - 1), np.int64(-1),
                            np.float64("nan")])
        return v2, "numpy %r" % (v2[i],), None, False
    if k == 9:
        return np.array(v, dtype=rng.choice([np.int64, np.int32])), "numpy array", v, True
    if k == 10:
        a = np.array(v, dtype=np.float64)
        a[i] += 0.5
        return a, "numpy float array with .5", None, False
    if k == 11:
        return torch.tensor(v, dtype=rng.choice([torch.int64, torch.int32])), "torch int tensor", v, True
    if k == 12:
        t = torch.tensor(v, dtype=torch.float32)
        t[i] += 0.5
        return t, "torch float tensor with .5", None, False
    if k == 13:
        n = rng.choice([0, 1, E - 1, E + 1, 2 * E, 1000])
        w = (v * (n // E + 1))[:n]
        return w, "%d counts for %d experts" % (n, E), w, False
    if k == 14:
        v[i] = rng.choice([float("nan"), float("inf"), float("-inf"), 1e300, -0.0 if base[i] else 0.5])
        return v, "%r" % v[i], ([int(x) for x in v] if v[i] == 0 else None), False
    if k == 15:
        v[i] = rng.choice([None, "1", b"1", [1], {}, 1j])
        return v, "a %s" % type(v[i]).__name__, None, False
    if k == 16:
        v[i] = rng.choice([fractions.Fraction(5, 2), fractions.Fraction(2 * base[i], 2)])
        return v, "Fraction %s" % v[i], (None if v[i].denominator != 1 else [int(x) for x in v]), False
    return tuple(v), "a tuple", v, False


def hostile_c(rng, base, E, cap, nunits, unit, plain_units):
    """(int64 values, n, unit, NULL?, how, valid)."""
    v = list(base)
    i = rng.randrange(E)
    k = rng.randrange(9)
    n, u, null = E, unit, False
    if k == 0:
        return v, n, u, null, "valid", True
    if k == 1:
        v[i] = rng.choice([-1, -(1 << 63), -(1 << 31)])
        how = "negative %d" % v[i]
    elif k == 2:
        v[i] = rng.choice([I64_MAX, 1 << 62, (1 << 32) + base[i], 1 << 31])
        how = "%d" % v[i]
    elif k == 3:
        v[i] = cap + 1
        how = "a member's share past the capacity %d" % cap
    elif k == 4:
        # every member's counts near the limit: a sum that would wrap an int64
        v = [I64_MAX // 2 + 1] * E
        how = "counts summing past 2^63"
    elif k == 5:
        n = rng.choice([0, -1, E - 1, E + 1, -(1 << 31), (1 << 31) - 1])
        how = "n = %d" % n
    elif k == 6:
        null = True
        how = "NULL counts"
    elif k == 7:
        u = rng.choice([-1, nunits, 1 << 30, -(1 << 31), 0])
        how = "unit %d" % u
    else:
        u = rng.choice(plain_units)
        how = "unit %d (no all-to-all)" % u
    return v, n, u, null, how, False


# ---- the worker (one rank) --------------------------------------------------------------------

def one_line(s):
    return isinstance(s, str) and s.strip() != "" and "\n" not in s.strip() and "Traceback" not in s


def worker(args):
    import numpy as np
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    from commplan.runtime import HostLibrary

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    pj_path = os.path.join(REPO, OUT, "gen", PLAN, "plan.json")
    with open(pj_path) as f:
        pj = json.load(f)
    lib = HostLibrary(os.path.join(REPO, OUT, "bin", PLAN, "lib%s.so" % PLAN), PLAN, plan_json=pj)
    lib.init()
    clib = lib.lib
    # (as HostLibrary declares it)
    clib.cp_hostlib_set_expert_counts.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                                  ctypes.c_int]
    clib.cp_hostlib_set_expert_counts.restype = ctypes.c_int

    def reinit():
        # a fresh executor for the next case (a refused exchange ends the plan's step); the
        # process groups are kept
        clib.cp_hostlib_destroy(lib.g)
        err = ctypes.create_string_buffer(4096)
        g = ctypes.c_void_p()
        if clib.cp_hostlib_init(ctypes.byref(g), lib._plan, rank, lib._cb, None, err, len(err)) != 0:
            raise RuntimeError("cp_hostlib_init: " + err.value.decode(errors="replace"))
        lib.g = g
        clib.cp_hostlib_set_alltoall(g, lib._a2a_cb, None)

    units = [u for u in pj["units"] if u["arena"].get("a2a_send", {}).get("bytes")]
    counts_ops = {}
    for op in pj["ops"]:
        if op["kind"] == "a2a_counts" and op["unit"] not in counts_ops:
            counts_ops[op["unit"]] = op
    groups = {g["name"]: g for g in pj["groups"]}
    E = lib.num_experts()
    nunits = len(pj["units"])
    plain = [x["index"] for x in pj["units"] if x not in units]

    def members_of(r, op):
        g = groups[op["group"]]
        for color in range(world // g["size"]):
            m = lib.group_members(g["id"], color)
            if r in m:
                return m
        raise AssertionError("rank %d in no ep group" % r)

    failures, counted = [], {"python": 0, "c": 0}
    accepted = refused = 0
    t0 = time.time()
    i = args.only - 1 if args.only else 0
    while True:
        i += 1
        stop = torch.tensor([0])
        if rank == 0 and not args.only and ((time.time() - t0 >= args.seconds and i > args.min_cases)
                                            or len(failures) >= 20):
            stop[0] = 1
        if args.only and i > args.only:
            stop[0] = 1
        dist.broadcast(stop, 0)
        if stop.item():
            break
        rng = random.Random(args.seed * 1000003 + i)
        surface = rng.choice(["python", "c"])
        counted[surface] += 1
        unit = rng.choice(units)
        u = unit["index"]
        cop = counts_ops[unit["name"]]
        epp, cap = cop["a2a"]["experts_per_member"], cop["a2a"]["capacity_rows"]
        hostile = rng.randrange(world)
        bases = [valid_counts(rng, E, epp, cap) for _ in range(world)]
        if surface == "python":
            given, how, exact, must_accept = hostile_python(rng, bases[hostile], E, epp, cap, np, torch)
        else:
            vals, n, cu, null, how, must_accept = hostile_c(rng, bases[hostile], E, cap, nunits, u, plain)
        members = members_of(hostile, cop)
        why = None
        # this rank's counts
        if rank != hostile:
            ok_set, err_set = lib.set_expert_counts(u, bases[rank]), None
            if not ok_set:
                why = "valid counts %r refused: %s" % (bases[rank], lib.last_error())
            sent_want = bases[rank]
        elif surface == "python":
            try:
                ok_set, err_set = lib.set_expert_counts(u, given), None
            except Exception as e:  # noqa: BLE001 - a refusal may be raised: judged below
                ok_set, err_set = False, "%s: %s" % (type(e).__name__, e)
            if not ok_set and err_set is None:
                err_set = lib.last_error()
            sent_want = exact
            valid = (exact is not None and len(exact) == E and all(0 <= x <= I64_MAX for x in exact) and
                     all(sum(exact[m * epp:(m + 1) * epp]) <= cap for m in range(E // epp)))
            if ok_set and not valid:
                why = "accepted %s" % how
                sent_want = None  # what the exchange split by is said below
            elif not ok_set and must_accept:
                why = "refused valid integer counts (%s): %s" % (how, err_set)
            elif not ok_set and not one_line(err_set):
                why = "the refusal is not one clear line: %r" % (err_set,)
        else:
            buf = (ctypes.c_int64 * (E + 8))(*(vals + [0] * (E + 8 - len(vals))))
            rc = clib.cp_hostlib_set_expert_counts(lib.g, cu, None if null else buf, n)
            ok_set = rc == 0
            err_set = None if ok_set else lib.last_error()
            sent_want = vals
            if rc not in (0, -1):
                why = "cp_hostlib_set_expert_counts returned %d (want 0 or -1)" % rc
            elif ok_set and not must_accept:
                why = "the C call accepted %s" % how
            elif not ok_set and must_accept:
                why = "the C call refused valid counts: %s" % err_set
            elif not ok_set and not one_line(err_set):
                why = "the C refusal is not one clear line: %r" % (err_set,)
        # every rank joins the exchange
        try:
            lib.exchange_tokens(u)
            ex_ok, ex_err = True, None
        except Exception as e:  # noqa: BLE001
            ex_ok, ex_err = False, "%s: %s" % (type(e).__name__, e)
        if why and ok_set and rank == hostile and ex_ok:
            got = lib.exchange_counts(u)
            if got is not None:
                why += ", and the exchange split by %r (given %r): silently wrapped or truncated" % (
                    got[:E].tolist(), list(given)[:E] if not hasattr(given, "tolist") else given.tolist()[:E])
        if why is None:
            if rank in members:
                # the hostile rank's verdict, known to its group's members
                verdict = _verdict_of(dist, ok_set if rank == hostile else None, hostile)
                if not verdict and ex_ok:
                    why = "the exchange after rank %d's refused counts (%s) was let through" % (hostile, how)
                elif not verdict and not one_line(ex_err):
                    why = "the exchange's refusal is not one clear line: %r" % (ex_err,)
                elif verdict and not ex_ok:
                    why = "the exchange of accepted counts (%s on rank %d) failed: %s" % (how, hostile, ex_err)
            else:
                _verdict_of(dist, ok_set if rank == hostile else None, hostile)
            if why is None and ex_ok and ok_set and sent_want is not None:
                got = lib.exchange_counts(u)
                sent = [int(x) for x in got[:E].tolist()] if got is not None else None
                if sent != list(sent_want)[:E]:
                    why = "the exchange split by %r, the counts given were %r (%s): %s" % (
                        sent, sent_want, how, "silently wrapped" if sent else "lost")
        else:
            _verdict_of(dist, ok_set if rank == hostile else None, hostile)
        if rank == hostile:
            if ok_set:
                accepted += 1
            else:
                refused += 1
        if why:
            failures.append("case %d (%s, rank %d: %s): rank %d: %s [rerun: tests/fuzz_ep_counts.py --seed %d --only %d]"
                            % (i, surface, hostile, how, rank, why, args.seed, i))
        if args.only and rank == hostile:
            print("case %d: %s counts on rank %d: %s; set: %s (%s); exchange: %s" % (
                i, surface, hostile, how, ok_set, err_set, "ok" if ex_ok else ex_err), flush=True)
        reinit()
    lib.close()
    allf = [None] * world
    dist.all_gather_object(allf, failures)
    tot = torch.tensor([accepted, refused])
    dist.all_reduce(tot)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    fails = [f for fl in allf for f in fl]
    cases = counted["python"] + counted["c"]
    for f in fails[:40]:
        print("FAIL " + f)
    bad = len({f.split(":")[0] for f in fails})
    print("fuzz_ep_counts: %d cases (python %d, c %d; %d accepted, %d refused), %d passed, %d failed"
          % (cases, counted["python"], counted["c"], tot[0].item(), tot[1].item(), cases - bad, bad))
    return 0 if not fails else 1


def _verdict_of(dist, ok, hostile):
    """The hostile rank's verdict (accepted?), broadcast to every rank."""
    import torch
    t = torch.tensor([1 if ok else 0])
    dist.broadcast(t, hostile)
    return bool(t.item())


# ---- the launcher -----------------------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--min-cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--only", type=int, default=0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.exit(worker(args))
    try:
        import numpy  # noqa: F401
        import torch
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            skip("torch %s at %s has no torch.distributed with gloo" % (torch.__version__, sys.executable))
    except Exception as e:  # noqa: BLE001
        skip("torch or numpy is not importable by %s (%s); make torch-env builds it" % (sys.executable, e))
    r = subprocess.run(["make", "--no-print-directory", "-s", "PLAN=tests/ep/plans/%s.lua" % PLAN,
                        "OUT=%s/gen/%s" % (OUT, PLAN), "BUILD=%s/bin/%s" % (OUT, PLAN),
                        "%s/bin/%s/lib%s.so" % (OUT, PLAN, PLAN)], cwd=REPO)
    if r.returncode:
        sys.exit("fuzz_ep_counts: building %s's library failed" % PLAN)
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(WORLD), PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"),
                                                                  os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--seconds", str(args.seconds), "--min-cases",
            str(args.min_cases), "--seed", str(args.seed), "--only", str(args.only)]
    procs = [subprocess.Popen(argv, cwd=REPO, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(WORLD)]
    deadline = time.time() + args.seconds + 300
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print("FAIL fuzz_ep_counts: the ranks did not finish within %d s (a rank left waiting in an exchange?)"
                  % (args.seconds + 300))
            sys.exit(1)
    sys.exit(0 if all(rc == 0 for rc in rcs) else 1)


if __name__ == "__main__":
    main()
