"""What gloo's reductions do to 16-bit values (torch's ProcessGroupGloo on
CPU), against two models: the binary's host arithmetic (runtime/dtype.c
cp_reduce_values: every member's value summed in fp32 in member order, one
rounding to the dtype, AVG divided before it) and a ring model (members
added in the reduction dtype, rounding after every addition, for the
chunk that ends on rank s in the order s-1, s-2, ..., s+1, s; AVG: that
sum, then divided and rounded again).

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
            fp32, ring = _models(allv[:, rank * N:(rank + 1) * N], rank, n, dt, avg)
            y = allv[rank].clone()
            dist.all_reduce(y, op=op)
            ar_fp32 = [(_models(allv, s, n, dt, avg)[0] == y) for s in range(1)][0]
            ar_ring = torch.stack([_models(allv, s, n, dt, avg)[1] == y for s in range(n)]).any(0)
            if rank == 0:
                print(f"{n} ranks {str(dt)[6:]:8s} {'AVG' if avg else 'SUM'}: reduce_scatter {N} elements: "
                      f"binary's fp32 model {(fp32 == out).sum().item()}, ring model {(ring == out).sum().item()}; "
                      f"all_reduce {n * N}: fp32 model {ar_fp32.sum().item()}, some ring order "
                      f"{ar_ring.sum().item()}", flush=True)
    dist.destroy_process_group()


def main():
    ranks = [int(x) for x in sys.argv[1:]] or [3, 4, 5, 8]
    for n in ranks:
        fd, init = tempfile.mkstemp(prefix="gloo-arith.")
        os.close(fd)
        os.unlink(init)
        mp.spawn(_rank, args=(n, init, 1000), nprocs=n)


if __name__ == "__main__":
    main()
