"""What gloo's reductions do to 16-bit values (torch's ProcessGroupGloo on
CPU), against two models: a one-rounding model (runtime/dtype.c
cp_reduce_values, the binary's gloo arithmetic before it followed gloo's
ring: every member's value summed in fp32 in member order, one rounding to
the dtype, AVG divided before it) and gloo's ring (cp_reduce_values_gloo:
members added in the reduction dtype, rounding after every addition, for
the chunk that ends on rank s in the order s-1, s-2, ..., s+1, s; AVG: that
sum, then divided and rounded again). Which chunk an element is in follows
gloo's ring segmentation (cp_gloo_all_reduce_key, _chunks here), for
all_reduce and for reduce_scatter, which ProcessGroupGloo runs as an
all_reduce of the whole input.

  tests/live/gloo_arith.py [RANKS...]     (torch-env python; default 3 4 5 8)

Prints, per rank count, dtype, op and collective, how many of the outputs
each model reproduces. Not part of make test: a reproducer for the
live property test's "collective arithmetic" differences.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _models(V, s, n, dt, avg):
    fp32 = V.float().sum(0)
    if avg:
        fp32 = fp32 / n
    fp32 = fp32.to(dt)
    order = [(s - 1 - i) % n for i in range(n)]
    acc = V[order[0]].clone()
    for i in order[1:]:
        acc = (acc.float() + V[i].float()).to(dt)
    if avg:
        acc = (acc.float() / n).to(dt)
    return fp32, acc


def _chunks(count, n, es):
    """The chunk (the rank it ends on) of each element of a gloo all_reduce
    of count elements of es bytes: gloo/allreduce.cc ring()'s segments."""
    segments = max(-(-count * es // (1 << 20)), 2 * n)
    segments = -(-segments // n) * n
    segment = -(-count // segments)
    return torch.arange(count) // segment // (segments // n)


def _ring(V, n, dt, avg):
    chunk = _chunks(V.shape[1], n, V.element_size())
    out = torch.empty(V.shape[1], dtype=dt)
    for s in range(n):
        m = chunk == s
        out[m] = _models(V[:, m], s, n, dt, avg)[1]
    return out


def _rank(rank, n, init, N):
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=n)
    g = torch.Generator().manual_seed(7)
    for dt in (torch.bfloat16, torch.float16):
        for avg in (False, True):
            op = dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM
            # values whose 16-bit sums round: up to 3000 for fp16, 400 for bf16
            allv = torch.randint(1, 3000 if dt == torch.float16 else 400, (n, n * N), generator=g).float().to(dt)
            out = torch.empty(N, dtype=dt)
            dist.reduce_scatter_single(out, allv[rank].clone(), op=op)
            fp32 = _models(allv[:, rank * N:(rank + 1) * N], rank, n, dt, avg)[0]
            ring = _ring(allv, n, dt, avg)[rank * N:(rank + 1) * N]
            y = allv[rank].clone()
            dist.all_reduce(y, op=op)
            ar_fp32 = _models(allv, 0, n, dt, avg)[0] == y
            ar_ring = _ring(allv, n, dt, avg) == y
            if rank == 0:
                print(f"{n} ranks {str(dt)[6:]:8s} {'AVG' if avg else 'SUM'}: reduce_scatter {N} elements: "
                      f"one-rounding model {(fp32 == out).sum().item()}, ring model {(ring == out).sum().item()}; "
                      f"all_reduce {n * N}: one-rounding model {ar_fp32.sum().item()}, ring model "
                      f"{ar_ring.sum().item()}", flush=True)
    dist.destroy_process_group()


def main():
    ranks = [int(x) for x in sys.argv[1:]] or [3, 4, 5, 8]
    for n in ranks:
        fd, init = tempfile.mkstemp(prefix="gloo-arith.")
        os.close(fd)
        os.unlink(init)
        mp.spawn(_rank, args=(n, init, 1001), nprocs=n)  # odd: gloo's chunks straddle the ranks' shares


if __name__ == "__main__":
    main()
