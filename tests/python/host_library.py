"""A host stand-in for build/<name>/lib<name>.so, for one-rank plans: the same calls as
commplan.runtime.GpuLibrary over CPU tensors, with FSDP2's one-rank semantics (all-gather and
reduce-scatter are copies, AVG over one rank is the identity, casts as the plan's dtypes say).

Freed storage is poisoned with NaN -- the unsharded parameters at every reshard (the plan's
arena gives those bytes to other units) and the unsharded gradients after every reduce (the
next backward must write, not accumulate) -- so a runtime that computes on resharded
parameters or adds into stale gradients produces NaN instead of passing by luck.
"""

import torch

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class HostLibrary:
    def __init__(self, plan):
        if plan["world_size"] != 1:
            raise ValueError("HostLibrary runs one-rank plans only (plan %s has %d ranks)"
                             % (plan["plan"], plan["world_size"]))
        self.plan = plan
        self.fingerprint = plan["fingerprint"]
        self.g = None
        self.calls = []

    def init(self):
        self.g = object()
        self.rank = self.shard_rank = 0
        self.device = torch.device("cpu")
        units = sorted(self.plan["units"], key=lambda u: u["index"])
        self.units = []
        self.buf = {"sharded": [], "unsharded": [], "grad": [], "sharded_grad": []}
        nan = float("nan")
        for u in units:
            idx = []
            for p in u["params"]:
                idx.append(len(self.buf["sharded"]))
                self.buf["sharded"].append(torch.full((p["padded_numel"],), nan, dtype=DT[p["dtype"]]))
                self.buf["sharded_grad"].append(torch.full((p["padded_numel"],), nan, dtype=DT[p["dtype"]]))
                self.buf["unsharded"].append(torch.full((p["numel"],), nan, dtype=DT[u["ag_dtype"]]))
                self.buf["grad"].append(torch.full((p["numel"],), nan, dtype=DT[u.get("grad_dtype", u["ag_dtype"])]))
            self.units.append((u, idx))
        # Each unit's reductions in the step, in order: whether its view-out adds into the
        # sharded grads (view_out_add, a later reduction of the step) or assigns them.
        index = {u["name"]: u["index"] for u in units}
        self.reduce_adds = {u["index"]: [] for u in units}
        # and the parameters it covers (plan.json's op "params": a part, ChunkedLossWrapper's; None: all)
        # (CPU offload: an offloading unit's reduction ends in its D2H, d2h or d2h_add, which adds)
        offload = {u["name"] for u in units if u.get("cpu_offload")}
        for op in self.plan["ops"]:
            ends = ("d2h", "d2h_add") if op["unit"] in offload else ("view_out", "view_out_add")
            if op["kind"] in ends:
                self.reduce_adds[index[op["unit"]]].append((op["kind"].endswith("_add"), op.get("params")))
        self.reduce_cursor = {u["index"]: 0 for u in units}

    def tensor(self, kind, param, numel, dtype, host=False):  # (host: CPU offload; all host memory here)
        t = self.buf[kind][param]
        assert t.dtype == DT[dtype] and t.numel() >= numel, (kind, param, numel, dtype)
        return t[:numel]

    def call(self, call, unit):
        self.calls.append((call, unit))
        u, idx = self.units[unit]
        nan = float("nan")
        # .data: the library writes device memory behind autograd's back (no version-counter bump),
        # as the GPU library's kernels do
        b = {k: [t.data for t in v] for k, v in self.buf.items()}
        adds, part = False, None
        if call == "reduce":
            seq = self.reduce_adds[u["index"]]
            adds, part = seq[self.reduce_cursor[u["index"]] % len(seq)]
            self.reduce_cursor[u["index"]] += 1
        with torch.no_grad():
            for i, p in zip(idx, u["params"]):
                n = p["numel"]
                if call == "unshard":  # copy-in (cast to the all-gather dtype), all-gather, copy-out
                    b["unsharded"][i].copy_(b["sharded"][i][:n].to(DT[u["ag_dtype"]]))
                elif call == "reshard":
                    b["unsharded"][i].fill_(nan)
                elif call == "reduce" and (part is not None and p["name"] not in part or p.get("frozen")):
                    continue  # (a frozen parameter, requires_grad=False: no gradient, never reduced)
                elif call == "reduce":  # pack (cast to reduce dtype), AVG over one rank, view-out (cast back)
                    red = b["grad"][i].to(DT[u["reduce_dtype"]]).to(DT[p["dtype"]])
                    if adds:  # view_out_add: into the sharded grads, in their dtype
                        b["sharded_grad"][i][:n].add_(red)
                    else:
                        b["sharded_grad"][i][:n].copy_(red)
                    b["grad"][i].fill_(nan)
                else:
                    raise AssertionError(call)

    def synchronize(self, timeout_s):
        pass

    def close(self):
        self.g = None
