"""Real torchtitan 0.3 jobs with one fault each (tests/diagnose/faults.py,
cases withhold_counts and pp_microbatches), Flight Recorder on
(TORCH_FR_BUFFER_SIZE); 4 ranks forked from this process (torch and
torchtitan imported once: each rank importing them costs ~25 s on a 2-core
machine), dumps written as fault_job.py writes them (a failed collective or
a SIGTERM: every rank dumps; a rank that finishes dumps too).

EP_CASE (one of tests/ep/ep_cases.py's cases; dp4_ep2: torchtitan's
DeepSeek-V3 decoder, tiny, parallelize_deepseekv3 at dp_shard 4 x ep 2, FSDP2
on gloo, its AllToAllTokenDispatcher on the ep mesh; tests/ep/torch_ep_record.py's
model and parallelization): STEPS forward + backward steps.
PP_CASE (one of tests/pp/pp_titan_cases.py's; qwen3_pp2: torchtitan's
pipeline_llm, pp 2 x dp_shard 2, 1F1B, torch.distributed.pipelining's
schedule; tests/pp/torch_pp_titan_record.py's run_case): one step.

Faults (FAULT):
  none             the plan's steps on every rank
  withhold_counts  (EP_CASE) FAULT_RANK's first MoE layer at FAULT_STEP skips the
                   expert-count all-to-all (AllToAllTokenDispatcher._token_count_exchange,
                   torchtitan/models/common/token_dispatcher.py:245): it takes its own
                   counts for its peers' and goes on to the tokens' all-to-all
  pp_microbatches  (PP_CASE) FAULT_RANK's local batch is twice the others': its
                   schedule has twice the microbatches (torchtitan's n_microbatches =
                   local_batch_size // microbatch_size, pipeline_parallel.py)
"""
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "ep"))
sys.path.insert(0, os.path.join(ROOT, "tests", "pp"))
sys.path.insert(0, HERE)
import torch_ep_record as R  # noqa: E402 -- the model, the gloo workaround, torch and torchtitan imported

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

CASE = os.environ.get("EP_CASE", "dp4_ep2")
PP_CASE = os.environ.get("PP_CASE")


def withhold(fj):
    """FAULT_RANK's first MoE layer at FAULT_STEP: no expert-count exchange."""
    from torchtitan.models.common import token_dispatcher as TD
    orig = TD.AllToAllTokenDispatcher._token_count_exchange
    state = {"step": -1, "done": False}

    def hooked(self, counts, pg, ep_size):
        if fj.FAULT == "withhold_counts" and fj.FAULTY and state["step"] == fj.FAULT_STEP and not state["done"]:
            state["done"] = True
            print(f"rank {fj.RANK}: withholding the expert-count exchange of step {state['step']}", flush=True)
            return _local(counts, pg, ep_size)
        return orig(self, counts, pg, ep_size)

    def _local(counts, pg, ep_size):
        # its own counts for every peer's, typed as the exchange's result (spmd_types' V)
        import spmd_types as spmd
        out = counts.view(ep_size, -1).clone()
        try:
            spmd.assert_type(out, {pg: spmd.V})
        except Exception:  # noqa: BLE001 -- a type the counts already carry: the clone keeps it
            pass
        return out
    TD.AllToAllTokenDispatcher._token_count_exchange = hooked
    return state


def ep_steps(rank, world, fj, state):
    """STEPS forward + backward steps of EP_CASE, as torchtitan's Trainer runs one (no optimizer step)."""
    import spmd_types as spmd
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types
    from torchtitan.distributed.utils import get_spmd_context, set_spmd_backend
    case = R.CASES[CASE]
    parallelism = ParallelismConfig(data_parallel_shard_degree=case["dp_shard"],
                                    expert_parallel_degree=case["ep"],
                                    tensor_parallel_degree=case.get("tp", 1))
    set_spmd_backend(parallelism.spmd_backend)
    training = TrainingConfig(local_batch_size=case["batch"], seq_len=case["seq"], dtype="float32",
                              mixed_precision_param="float32", mixed_precision_reduce="float32",
                              disable_cuda_graphs=True)
    pd = ParallelDims.from_config(parallelism, world)
    pd.build_mesh()
    model = R.build(case, pd, parallelism, training)
    m = R.model_of(case)
    B, L = case["batch"], case["seq"]
    for step in range(fj.STEPS):
        state["step"] = step
        tokens = torch.randint(0, m["vocab_size"], (B, L + 1),
                               generator=torch.Generator().manual_seed(100 + rank + 10 * step))
        inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        positions = torch.arange(L).repeat(B, 1)
        extra = {"positions": positions, "attention_masks": model.get_attention_masks(positions=positions)}
        inputs, labels, extra = annotate_input_spmd_types(pd, inputs, labels, extra)
        with get_spmd_context(parallel_dims=pd)():
            pred = model(inputs, **extra)
            loss = cross_entropy_loss(pred, labels, global_vocab_size=m["vocab_size"])
            with spmd.no_typecheck():
                loss.backward()
        for p in model.parameters():
            p.grad = None


def pp_step(rank, fj):
    """One step of PP_CASE: torchtitan's pipeline_llm and pp_forward_backward_step
    (tests/pp/torch_pp_titan_record.py's run_case), the fault's rank with twice the batch."""
    import torch_pp_titan_record as PPR
    R.install_labels()
    case = dict(PPR.CASES[PP_CASE])
    if fj.FAULT == "pp_microbatches" and fj.FAULTY:
        case["batch"] = 2 * case["batch"]
        print(f"rank {rank}: {case['batch']} microbatches where the others have {case['batch'] // 2}", flush=True)
    PPR.run_case(rank, case)


def rank_main(rank, world, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import fault_job as fj  # reads RANK: dump_once, watcher, FLAG
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    import titan_env as E
    E.cpu_training()
    import spmd_types._dist
    spmd_types._dist.set_dist(R.GlooDist())
    state = withhold(fj)
    timeout = timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT_S", "3")))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world,
                            timeout=timeout)
    threading.Thread(target=fj.watcher, daemon=True).start()
    try:
        if PP_CASE:
            pp_step(rank, fj)
        else:
            ep_steps(rank, world, fj, state)
    except Exception as e:  # noqa: BLE001 -- a failed collective: every rank dumps
        open(fj.FLAG, "a").close()
        fj.dump_once()
        print(f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}", flush=True)
        if os.environ.get("EP_TRACEBACK"):
            traceback.print_exc()
        time.sleep(1)
        os._exit(1)
    time.sleep(0.5)
    fj.dump_once()
    os._exit(0)


def main():
    world = R.CASES[CASE]["world"]
    if PP_CASE:
        import pp_titan_cases
        world = pp_titan_cases.CASES[PP_CASE]["world"]
    import titan_env  # noqa: F401
    import torchtitan.trainer  # noqa: F401
    import torchtitan.components.loss  # noqa: F401
    try:
        mp.start_processes(rank_main, args=(world, R.free_port()), nprocs=world, join=True, start_method="fork")
    except Exception as e:  # noqa: BLE001 -- a rank failed: its exit is the job's
        print("titan job: %s" % str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
