"""Expert parallelism through the host library under torch's own launcher: every EP test plan's
library calls (python/commplan/runtime.py HostLibrary: cp_hostlib_unshard / _reshard /
_reduce_grads and exchange_tokens) in the plan's order, 4 ranks on gloo under torchrun, each
collective and all-to-all a torch.distributed call (all_to_all_single with the rows' split sizes
on the ep group's process group), as tests/lib/ep_library.c drives the GPU library:

  forward   counts per global expert drawn from (rank, step, micro-step, unit), within each ep
            member's capacity (some experts empty, some members full), set_expert_counts, rows
            written into tokens(unit, 0) whose values say sender, expert, row, element and
            direction; exchange_tokens: the counts and the dispatch. Every received row in
            tokens(unit, 1) is checked against its sender's draw, and exchange_counts against the
            draws, sent and received; the experts' "output" (each value xor a per-expert key)
            written over them; exchange_tokens: the combine, and tokens(unit, 0) must hold the
            rows sent, xor their expert's key;
  backward  the same with the gradient rows (another direction), split by that micro-step's
            forward counts.

Then, on ep2_mixtral, counts refused and accepted at the edges (set_expert_counts through the
ctypes bridge): rank 1 gives 2.5, 2.0, True, -1, 2^64 + 1, numpy's uint64 2^64 - 1, or one row past
a member's capacity in the first experts unit's counts; set_expert_counts returns False, rank 1
still makes the exchange, and it raises on both members of that ep group (rank 1 with its own one
line, rank 0 naming rank 1), while the other ep group's exchange runs; numpy and torch integer
counts (an int64 array, numpy scalars, an int tensor) are taken exactly.

Values are the unit's ag dtype's bits (an integer view of the token view): no arithmetic on
them, so bf16 rows are compared exactly too. Every rank checks all of its rows and counts; rank 0
prints one line per plan and a closing count line.

    tests/python/ep_library.py [TORCHRUN]    (from the repository root; make test runs it)

Needs torch with torch.distributed (gloo) and torchrun beside the python (make torch-env);
anywhere else one SKIP line and exit 77.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

WORLD = 4
PLANS = ("ep2_mixtral", "ep4_mixtral_efsdp1")  # ep 2 (fp32) and ep 4 (bf16 rows), 4 ranks each
OUT = os.path.join("build", "ep", "lib")       # its own build tree: the foreground builds build/gen/ep*
M64 = (1 << 64) - 1


def skip(why):
    print("SKIP ep_library_py: %s" % why)
    sys.exit(77)


def mix64(x):
    x &= M64
    x ^= x >> 33
    x = (x * 0xff51afd7ed558ccd) & M64
    x ^= x >> 33
    x = (x * 0xc4ceb9fe1a85ec53) & M64
    return x ^ (x >> 33)


def draw_counts(counts_op, n, rank, step, unit):
    """Rank's tokens per global expert for this counts op: each member's share within capacity."""
    a = counts_op["a2a"]
    epp, cap = a["experts_per_member"], a["capacity_rows"]
    out = []
    for m in range(n):
        h = mix64((rank << 40) ^ (step << 32) ^ (counts_op.get("micro_step", 0) << 24) ^ (unit << 8) ^ m)
        left = cap if (h & 7) == 0 else cap * (h % 100) // 100
        for e in range(epp):
            c = left if e == epp - 1 else mix64(h + e) % (left + 1)
            if (mix64(h ^ e) & 3) == 0:
                c = 0
            out.append(c)
            left -= c
    return out


def row_values(torch, s, step, micro, unit, e, j, dim, direction, bits):
    """Row j of sender s's rows for global expert e: dim integers of the dtype's width."""
    base = mix64((s << 48) ^ (step << 40) ^ (micro << 34) ^ (unit << 24) ^ (e << 12) ^ direction ^
                 (j * 0x9e3779b97f4a7c15))
    mask = (1 << bits) - 1
    half = 1 << (bits - 1)
    vals = [(mix64(base + d) & mask) for d in range(dim)]
    return torch.tensor([v - (1 << bits) if v >= half else v for v in vals], dtype=INT_OF[bits](torch))


def expert_key(e, bits):
    return (0x5a5 ^ (e * 0x3b1)) & ((1 << (bits - 1)) - 1)


INT_OF = {16: lambda t: t.int16, 32: lambda t: t.int32}


class CaseDone(Exception):
    """A counts case ends after its first exchange: whether set_expert_counts took the counts, and
    what exchange_tokens raised (None: it ran)."""

    def __init__(self, taken, raised):
        super().__init__(raised)
        self.taken, self.raised = taken, raised


REFUSER = 1  # the rank whose counts each case changes


def counts_cases(torch, np):
    """(name, counts rank REFUSER gives from its drawn counts and the capacity, the words of its
    refusal or None: taken exactly)."""
    def at0(v):
        return lambda c, cap: [v] + c[1:]

    def over(c, cap):  # one row past member 0's capacity, all to expert 0
        return [cap + 1] + [0] * (len(c) // 2 - 1) + c[len(c) // 2:]
    return [
        ("2.5", at0(2.5), "count for expert 0 is float 2.5, not a whole number of tokens"),
        ("2.0", at0(2.0), "count for expert 0 is float 2.0, not a whole number of tokens"),
        ("True", at0(True), "count for expert 0 is bool True, not a whole number of tokens"),
        ("-1", at0(-1), "expert 0's count -1 for ep member 0 (rank 0) is negative"),
        ("2^64+1", at0((1 << 64) + 1), "count for expert 0 is 18446744073709551617, outside the libraries' int64"),
        ("numpy uint64 2^64-1", at0(np.uint64((1 << 64) - 1)), "outside the libraries' int64 counts"),
        ("past capacity", over, "exceed its capacity of"),
        ("numpy int64 array", lambda c, cap: np.array(c, dtype=np.int64), None),
        ("numpy scalars", lambda c, cap: [np.int32(x) for x in c], None),
        ("torch int64 tensor", lambda c, cap: torch.tensor(c, dtype=torch.int64), None),
    ]


class Driver:
    def __init__(self, torch, lib, plan, rank, case=None):
        self.torch, self.lib, self.plan, self.rank, self.case = torch, lib, plan, rank, case
        self.units = {u["name"]: u for u in plan["units"]}
        self.groups = {g["name"]: g for g in plan["groups"]}
        self.by_seq = {o["seq"]: o for o in plan["ops"]}
        self.calls = self.exchanges = self.rows = self.counts = 0
        self.pairs = {}
        self.step = 0

    def ep_group(self, op):
        """This rank's ep group: its members (global ranks, key order) and its key."""
        g = self.groups[op["group"]]
        for color in range(self.plan["world_size"] // g["size"]):
            members = self.lib.group_members(g["id"], color)
            if self.rank in members:
                return members, members.index(self.rank)
        raise AssertionError("rank %d is in no instance of group %s" % (self.rank, op["group"]))

    def fail(self, op, what):
        raise AssertionError("%s rank %d step %d micro-step %d unit %s: %s" % (
            self.lib.name, self.rank, self.step, op.get("micro_step", 0), op["unit"], what))

    def exchange(self, op, a2a, counts_op):
        torch, lib = self.torch, self.lib
        U = self.units[op["unit"]]
        u = U["index"]
        members, key = self.ep_group(counts_op)
        n, epp = len(members), counts_op["a2a"]["experts_per_member"]
        E, dim, micro = n * epp, counts_op["a2a"]["row_numel"], counts_op.get("micro_step", 0)
        combine = a2a["a2a"]["exchange"] in ("combine", "dispatch_grad")
        if not combine:
            self.pairs[u] = self.pairs.get(u, 0) + 1
        direction = self.pairs[u]
        send, recv = lib.tokens(u, 0), lib.tokens(u, 1)
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[U["ag_dtype"]]
        if send.dtype != dt or recv.dtype != dt:
            self.fail(op, "token views are %s / %s, the unit's ag dtype is %s" % (send.dtype, recv.dtype, dt))
        bits = torch.empty(0, dtype=dt).element_size() * 8
        isend, irecv = send.view(INT_OF[bits](torch)), recv.view(INT_OF[bits](torch))
        counts = draw_counts(counts_op, n, self.rank, self.step, u)
        if not combine:
            at = 0
            for e in range(E):
                for j in range(counts[e]):
                    isend[at:at + dim] = row_values(torch, self.rank, self.step, micro, u, e, j, dim, direction, bits)
                    at += dim
            if op["kind"] == "a2a_counts" and self.case is not None:  # a counts case: its one exchange
                given = self.case[1](list(counts), counts_op["a2a"]["capacity_rows"]) \
                    if self.rank == REFUSER else counts
                taken = lib.set_expert_counts(u, given)
                try:
                    lib.exchange_tokens(u)  # made whatever set_expert_counts said: the rank joins it
                except RuntimeError as e:
                    raise CaseDone(taken, str(e)) from None
                got = lib.exchange_counts(u)
                if got is None or got[:E].tolist() != counts:
                    self.fail(op, "exchange_counts' sent counts %r, given %r" % (
                        None if got is None else got[:E].tolist(), counts))
                raise CaseDone(taken, None)
            # (a refusal is raised by the exchange, on every member: none is left waiting in it)
            if op["kind"] == "a2a_counts" and not lib.set_expert_counts(u, counts):
                lib.exchange_tokens(u)
                self.fail(op, "the exchange after set_expert_counts refused counts was let through")
            lib.exchange_tokens(u)
            self.calls += 1
            got = lib.exchange_counts(u)
            if got is None or len(got) != 2 * E:
                self.fail(op, "exchange_counts gave %r after an exchange" % (got,))
            if got[:E].tolist() != counts:
                self.fail(op, "exchange_counts' sent counts %r, drawn %r" % (got[:E].tolist(), counts))
            at = 0
            for m, s in enumerate(members):
                peer = draw_counts(counts_op, n, s, self.step, u)
                for le in range(epp):
                    e = key * epp + le
                    self.counts += 1
                    if int(got[E + m * epp + le]) != peer[e]:
                        self.fail(op, "received count from rank %d for expert %d: %d, drawn %d"
                                  % (s, e, int(got[E + m * epp + le]), peer[e]))
                    for j in range(peer[e]):
                        want = row_values(torch, s, self.step, micro, u, e, j, dim, direction, bits)
                        row = irecv[at:at + dim]
                        if not torch.equal(row, want):
                            self.fail(op, "%s: row %d of expert %d from rank %d: %s, want %s" % (
                                a2a["a2a"]["exchange"], j, e, s, row.tolist(), want.tolist()))
                        irecv[at:at + dim] = row ^ expert_key(e, bits)  # the experts' work
                        self.rows += 1
                        at += dim
            return
        lib.exchange_tokens(u)
        self.calls += 1
        at = 0
        for e in range(E):
            for j in range(counts[e]):
                want = row_values(torch, self.rank, self.step, micro, u, e, j, dim, direction, bits)
                want ^= expert_key(e, bits)
                row = isend[at:at + dim]
                if not torch.equal(row, want):
                    self.fail(op, "%s: returned row %d of expert %d: %s, want %s" % (
                        a2a["a2a"]["exchange"], j, e, row.tolist(), want.tolist()))
                self.rows += 1
                at += dim

    def run(self, steps):
        ops = self.plan["ops"]
        for self.step in range(steps):
            self.pairs = {}
            with_counts = None
            for i, op in enumerate(ops):
                k, name = op["kind"], op.get("unit")
                if name is None:
                    continue
                u = self.units[name]["index"]
                if k == "copy_out":
                    self.lib.call("unshard", u)
                elif k == "reshard":
                    self.lib.call("reshard", u)
                elif k == "pack":
                    self.lib.call("reduce", u)
                elif k == "a2a_counts":
                    j = next((j for j in range(i + 1, len(ops)) if ops[j]["kind"] == "a2a" and
                              ops[j]["unit"] == name), None)
                    if j is None:
                        self.fail(op, "the counts op has no dispatch after it")
                    self.exchange(op, ops[j], op)
                    with_counts = j
                    self.exchanges += 1
                    continue
                elif k == "a2a" and i != with_counts:
                    self.exchange(op, op, self.by_seq[op["a2a"]["counts_op"]])
                    self.exchanges += 1
                    continue
                else:
                    continue
                self.calls += 1


def counts_refusals(torch, HostLibrary, rank):
    """Every counts case on ep2_mixtral, a fresh library each; this rank's report row."""
    import numpy as np
    name = "ep2_mixtral"
    with open(os.path.join(REPO, OUT, "gen", name, "plan.json")) as f:
        pj = json.load(f)
    errs, ran = [], 0
    for case in counts_cases(torch, np):
        lib = HostLibrary(os.path.join(REPO, OUT, "bin", name, "lib%s.so" % name), name, plan_json=pj)
        lib.init()
        d = Driver(torch, lib, pj, rank, case)
        try:
            d.run(1)
            errs.append("%s: the plan has no counts exchange" % case[0])
        except CaseDone as done:
            ran += 1
            first = next(op for op in pj["ops"] if op["kind"] == "a2a_counts")
            members, _ = d.ep_group(first)
            want = case[2]
            why = None
            if REFUSER not in members or want is None:  # the other ep group, or counts taken: the exchange ran
                if not done.taken or done.raised is not None:
                    why = "set_expert_counts gave %s, the exchange raised %r" % (done.taken, done.raised)
            elif rank == REFUSER:  # refused here: False, and the exchange raises with this rank's own line
                if done.taken or done.raised is None or want not in done.raised or "\n" in done.raised:
                    why = "set_expert_counts gave %s, the exchange raised %r; want False and %r" % (
                        done.taken, done.raised, want)
            elif not done.taken or done.raised is None or \
                    "ep member %d (rank %d) refused its expert counts" % (members.index(REFUSER), REFUSER) \
                    not in done.raised:
                why = "set_expert_counts gave %s, the exchange raised %r; want rank %d's refusal named" % (
                    done.taken, done.raised, REFUSER)
            if why:
                errs.append("%s: %s" % (case[0], why))
        except Exception as e:  # noqa: BLE001 - reported, as every rank's
            errs.append("%s: %s: %s" % (case[0], type(e).__name__, e))
        lib.close()
    return dict(plan=name + " counts", rank=rank, err="; ".join(errs) or None, calls=0, exchanges=ran, rows=0,
                counts=ran, ep=pj["expert_parallel"]["ep"], dtype="cases", cases=len(counts_cases(torch, np)))


def worker(args):
    import torch
    import torch.distributed as dist
    from commplan.runtime import HostLibrary

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = []
    for name in args.plans.split(","):
        pj_path = os.path.join(REPO, OUT, "gen", name, "plan.json")
        with open(pj_path) as f:
            pj = json.load(f)
        lib = HostLibrary(os.path.join(REPO, OUT, "bin", name, "lib%s.so" % name), name, plan_json=pj)
        lib.init()
        d = Driver(torch, lib, pj, rank)
        err = None
        try:
            d.run(args.steps)
        except Exception as e:  # noqa: BLE001 - every rank reports; rank 0 prints
            err = "%s: %s" % (type(e).__name__, e)
        lib.close()
        report.append(dict(plan=name, rank=rank, err=err, calls=d.calls, exchanges=d.exchanges, rows=d.rows,
                           counts=d.counts, ep=pj["expert_parallel"]["ep"],
                           dtype=next(u["ag_dtype"] for u in pj["units"] if u["arena"]["a2a_send"]["bytes"])))
        if err:
            break  # a peer may be waiting in a collective this rank will not make: stop here
    if not any(r["err"] for r in report) and "ep2_mixtral" in args.plans.split(","):
        report.append(counts_refusals(torch, HostLibrary, rank))
    out = [None] * args.world
    dist.all_gather_object(out, report)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    passed = failed = 0
    names = args.plans.split(",") + ([out[0][-1]["plan"]] if out[0] and out[0][-1]["plan"].endswith(" counts")
                                     else [])
    for i, name in enumerate(names):
        rows = [out[r][i] for r in range(args.world) if i < len(out[r])]
        if name.endswith(" counts"):
            bad = [r for r in rows if r["err"]] + [None] * (args.world - len(rows))
            if not bad:
                passed += 1
                print("ok   %s: %d cases through set_expert_counts (2.5, 2.0, True, -1, 2^64+1, numpy uint64 "
                      "2^64-1, one row past capacity refused on rank %d, the exchange still made and raised on "
                      "both members of its ep group, the other group's run; numpy and torch integers taken "
                      "exactly), on %d ranks" % (name, rows[0]["cases"], REFUSER, args.world))
            else:
                failed += 1
                print("FAIL %s" % name)
                for r in rows:
                    if r["err"]:
                        print("  rank %d: %s" % (r["rank"], r["err"]))
            continue
        for r in rows:  # a plan whose tables lost their all-to-alls would check nothing: not a pass
            if not r["err"] and r["exchanges"] == 0:
                r["err"] = "no token exchanges in the plan: nothing was checked (an EP plan, ep > 1?)"
        bad = [r for r in rows if r["err"]] + [None] * (args.world - len(rows))
        if not bad and rows:
            passed += 1
            print("ok   %s: %d ranks (ep %d, %s rows) x %d steps, host library calls in the plan's order on gloo "
                  "under torchrun: %d calls, %d token exchanges per rank, %d rows and %d counts checked on all ranks, "
                  "every one exact" % (name, args.world, rows[0]["ep"], rows[0]["dtype"], args.steps, rows[0]["calls"],
                                       rows[0]["exchanges"], sum(r["rows"] for r in rows),
                                       sum(r["counts"] for r in rows)))
        else:
            failed += 1
            print("FAIL %s" % name)
            for r in rows:
                if r["err"]:
                    print("  rank %d: %s" % (r["rank"], r["err"]))
    print("ep_library_py: %d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("torchrun", nargs="?", help="torch's torchrun (default: beside this python)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--world", type=int, default=WORLD, help="ranks (the plans' world size; 8 for ep2_dsv3_shard1 "
                    "and ep2_mixtral_hsdp)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.exit(worker(args))
    try:
        import torch
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            skip("torch %s at %s has no torch.distributed with gloo" % (torch.__version__, sys.executable))
    except Exception as e:  # noqa: BLE001
        skip("torch is not importable by %s (%s); make torch-env builds it" % (sys.executable, e))
    torchrun = args.torchrun or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.access(torchrun, os.X_OK):
        skip("no torchrun at %s" % torchrun)
    for name in args.plans.split(","):
        r = subprocess.run(["make", "--no-print-directory", "-s", "PLAN=tests/ep/plans/%s.lua" % name,
                            "OUT=%s/gen/%s" % (OUT, name), "BUILD=%s/bin/%s" % (OUT, name),
                            "%s/bin/%s/lib%s.so" % (OUT, name, name)], cwd=REPO)
        if r.returncode:
            sys.exit("ep_library_py: building %s's library failed" % name)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(args.world), os.path.abspath(__file__),
                        "--worker", "--steps", str(args.steps), "--plans", args.plans, "--world", str(args.world)],
                       cwd=REPO, env=env, timeout=600)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
