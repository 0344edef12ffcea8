#!/usr/bin/env python3
"""Records the TP collectives PyTorch issues for a tiny torchtitan-style
Llama under tensor + sequence parallelism, and compares them, in order,
with the TP activation collectives commplan generates for the same model
(plans/llama_tiny_tp_rec.lua: tp = 2, local batch 2, seq_len 32).

Needs torch >= 2.4 (DTensor's parallelize_module with SequenceParallel and
PrepareModuleInput, torchtitan's plan); PyTorch 2.11 exists only on the lent
GPU machine. Everything else prints one "SKIP tp_record: ..." line and exits
0. Runs on CPU with gloo, two ranks as processes:

    python3 tests/tp_record.py [plan.json]        # default: build the plan, compare

What it records: every functional collective DTensor dispatches
(_c10d_functional all_gather_into_tensor / reduce_scatter_tensor /
all_reduce) in forward and backward of one step, with its input and output
element counts and dtype, through a TorchDispatchMode on each rank.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = "tests/plans/llama_tiny_tp_rec.lua"
DIM, LAYERS, HEADS, KV, VOCAB, SEQ, BATCH, TP = 64, 2, 4, 2, 250, 32, 2, 2


def skip(why):
    print("SKIP tp_record: %s" % why)
    sys.exit(0)


def torch_or_skip():
    try:
        import torch
        import torch.distributed  # noqa: F401
    except Exception as e:  # no torch, or a broken one
        skip("torch is not importable (%s); PyTorch 2.11 is on the GPU machine" % e)
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 4):
        skip("torch %s has no DTensor TP plan (needs >= 2.4)" % torch.__version__)
    return torch


def build_model(torch):
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            hd = DIM // HEADS
            self.wq = nn.Linear(DIM, HEADS * hd, bias=False)
            self.wk = nn.Linear(DIM, KV * hd, bias=False)
            self.wv = nn.Linear(DIM, KV * hd, bias=False)
            self.wo = nn.Linear(HEADS * hd, DIM, bias=False)

        def forward(self, x):
            # The collectives do not depend on the attention maths: a
            # shape-preserving stand-in keeps the recording about them.
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
            rep = HEADS // KV
            return self.wo(q * k.repeat_interleave(rep, dim=-1) * v.repeat_interleave(rep, dim=-1))

    class FeedForward(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.w1 = nn.Linear(DIM, hidden, bias=False)
            self.w2 = nn.Linear(hidden, DIM, bias=False)
            self.w3 = nn.Linear(DIM, hidden, bias=False)

        def forward(self, x):
            return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.attention = Attention()
            self.feed_forward = FeedForward(hidden)
            self.attention_norm = nn.RMSNorm(DIM)
            self.ffn_norm = nn.RMSNorm(DIM)

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            hidden = 16 * ((int(1.3 * (2 * 4 * DIM // 3)) + 15) // 16)
            self.tok_embeddings = nn.Embedding(VOCAB, DIM)
            self.layers = nn.ModuleDict({str(i): Block(hidden) for i in range(LAYERS)})
            self.norm = nn.RMSNorm(DIM)
            self.output = nn.Linear(DIM, VOCAB, bias=False)

        def forward(self, tokens):
            h = self.tok_embeddings(tokens)
            for layer in self.layers.values():
                h = layer(h)
            return self.output(self.norm(h))

    return Llama()


def apply_tp(torch, model, mesh):
    """torchtitan's llama3 apply_tp, with sequence parallelism, loss parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for block in model.layers.values():
        parallelize_module(block, mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })


def rank_main(rank, out_path):
    torch = torch_or_skip()
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.utils._python_dispatch import TorchDispatchMode

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=TP)
    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = build_model(torch)
    apply_tp(torch, model, mesh)
    log = []
    phase = ["forward"]

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket)
            for kind in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"):
                if name.endswith(kind):
                    x = args[0]
                    log.append({"phase": phase[0], "op": kind, "dtype": str(x.dtype),
                                "in_numel": x.numel(), "out_numel": out.numel()})
            return out

    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    with Recorder():
        logits = model(tokens)
        phase[0] = "loss"
        with loss_parallel():
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten(0, 1))
            phase[0] = "backward"
            loss.backward()
    with open(out_path % rank, "w") as f:
        json.dump({"rank": rank, "log": log}, f, indent=1)
    dist.destroy_process_group()


# commplan's kinds for PyTorch's, and what its count means (per rank).
KIND = {"all_gather_into_tensor": "tp_all_gather", "reduce_scatter_tensor": "tp_reduce_scatter",
        "all_reduce": "tp_all_reduce"}


def compare(recording, plan_json):
    ours = [o for o in plan_json["ops"] if o.get("group") == "tp" and o["micro_step"] == 0]
    theirs = [e for e in recording["log"] if e["phase"] != "loss"]
    loss = [e for e in recording["log"] if e["phase"] == "loss"]
    bad = 0
    for i in range(max(len(ours), len(theirs))):
        a = ours[i] if i < len(ours) else None
        b = theirs[i] if i < len(theirs) else None
        want = None
        if b:
            count = b["out_numel"] if b["op"] == "reduce_scatter_tensor" else b["in_numel"]
            want = (KIND[b["op"]], b["phase"], count)
        got = (a["kind"], a["phase"], a["count"]) if a else None
        if got != want:
            bad += 1
            print("  TP collective %d: commplan %s, PyTorch %s" % (i, got, want))
    print("tp_record: %d TP collectives recorded (+%d in the loss), commplan %d, %d differ"
          % (len(theirs), len(loss), len(ours), bad))
    for e in loss:
        print("  loss-parallel (not modelled by commplan): %s %s in=%d" % (e["op"], e["dtype"], e["in_numel"]))
    return bad == 0


def main():
    torch = torch_or_skip()
    import torch.multiprocessing as mp
    plan_json = sys.argv[1] if len(sys.argv) > 1 else None
    if not plan_json:
        name = os.path.basename(PLAN)[:-4]
        subprocess.run(["make", "-s", "PLAN=" + PLAN], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        plan_json = os.path.join(ROOT, "build", name, "gen", "plan.json")
    out = os.path.join(ROOT, "build", "tp_record.rank%d.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    os.environ.setdefault("MASTER_PORT", "29511")
    mp.spawn(rank_main, args=(out,), nprocs=TP, join=True)
    del torch
    with open(plan_json) as f:
        plan = json.load(f)
    ok = all(compare(json.load(open(out % r)), plan) for r in range(TP))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
