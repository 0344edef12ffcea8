"""Run a PyTorch model's FSDP2 communication from its generated plan.

    fsdp = CommplanFSDP("llama_tiny", model, torchtitan_units(model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)     # the plan's sharded parameters
    loss = loss_fn(model(x)); loss.backward(); opt.step(); opt.zero_grad()

What it does, as FSDP2's fully_shard does it:

* checks the model against plans/<name>/plan.json (or build/<name>/gen/plan.json): unit order,
  every parameter's name, shape, dtype and shard dim; the first difference is one line;
* loads build/<name>/lib<name>.so (ctypes), bootstraps it from the launcher's environment
  (cp_launch_from_env: torchrun's store, COMMPLAN_ID_FILE, NCCL_COMM_ID or MASTER_ADDR; its own
  NCCL communicators, never torch's) and initializes this rank (cp_gpu_init);
* makes every parameter of the model an nn.Parameter viewing this rank's shard in the plan's
  sharded storage (torch.as_tensor over __cuda_array_interface__: zero copy), filled with the
  model's current values chunked as torch.chunk does (FSDP2's dim-0 sharding with padding);
* keeps one unsharded nn.Parameter per parameter viewing the plan's unsharded storage (the
  all-gather's copy-out target, in param_dtype) and swaps it into the module for forward and
  backward, as FSDP2 swaps its unsharded parameters;
* drives cp_gpu_unshard / cp_gpu_reshard / cp_gpu_reduce_grads from module hooks on torch's
  current stream: unshard in the unit's forward pre-hook and in its pre-backward hook (a grad
  hook on the unit's outputs), reshard after forward where the plan reshards, and after the
  unit's last parameter gradient arrives: copy the gradients into the plan's unsharded-grads
  buffer (first micro-batch) or add them (later ones, for plans with micro_steps > 1, in the
  unit's grad_dtype, as torch 2.15's FSDP2 sets the unsharded parameter's), reshard, and reduce
  where the plan reduces; by default (overlap=True) as the split calls (cp_gpu_unshard_issue /
  _wait, cp_gpu_reduce_issue / _wait) at the plan's places, prefetching the unshards the plan
  issues ahead and leaving reductions in flight until the unit's next reduction or the final
  callback, as FSDP2 does (commplan.overlap);
* sets each sharded parameter's .grad to this rank's reduced shard (a view of the plan's
  sharded-grads storage, zero copy); a later reduce before the optimizer consumed it (gradient
  accumulation as torchtitan does it: reduce-scatter every micro-batch) first moves the
  accumulated gradient out of the plan's storage and then adds the new shard to it, which is
  FSDP2's `sharded_param.grad += new_sharded_grad`.

The library calls must come in the plan's order (their event waits are the plan's): every call
is checked against the order derived from plan.json's ops, and a model that runs its units in
another order (a unit called twice, a loss the plan does not describe) is refused with one line
instead of racing. A unit the forward calls more than once per micro-batch (plan.json's units'
forward_calls: DeepSeek-V3's multi-token prediction, model.num_mtp_layers > 0) gets FSDP2's hooks
per call (torch 2.15 _fsdp_param_group.py pre_forward :637-651, post_forward :657-670,
pre_backward :679-693, RegisterPostBackwardFunction :1381-1398): every call unshards if resharded
and reshards after it where the plan does; its inputs' backward runs the call's post-backward
(reshard only while its gradient has not arrived, as FSDP2's, which finds no unsharded grad; the
next call's pre-backward then gathers it again), the one after the last gradient reshards and
reduces; the plan's ops follow the same per-call order (gen/parallel/fsdp_schedule.lua calls_micro).
Activation checkpointing as torchtitan applies it (checkpoint_wrapper around blocks): parameter
names without the wrapper's segment, and a recompute during backward makes no call, as FSDP2's
in PRE_BACKWARD state (commplan.recompute). torchtitan's ChunkedLossWrapper on a plan with
training.loss_chunks >= 2: the loss head's modules answer its FSDPModule calls, its chunks'
backwards accumulate lm_head's gradient and the last one reduces it (commplan.chunked_loss).
A forward under no_grad / inference_mode (evaluation) makes no library call:
commplan.training gathers each unit into temporary tensors over the plan's shard group and drops
them after the unit. clip_grad_norm_ (and torch.nn.utils.clip_grad_norm_ on the model's
parameters, while the bridge is open) clips by the global norm over the plan's shard group
(commplan.training).

state_dict() / load_state_dict() are fully_shard's sharded (DTensor) state dict, for
torch.distributed.checkpoint both ways with fully_shard (commplan.checkpoint; the optimizer's
too).

Tensor parallel plans (tp > 1): the model comes parallelized for TP as torchtitan does it, in
place of fully_shard the bridge drives the FSDP/HSDP collectives, torch the TP ones
(commplan.tensor_parallel).

Needs torch with CUDA and a plan built where nvcc was found (make PLAN=...).
"""

import ctypes
import os

try:
    import torch
    import torch.nn as nn
except ImportError as e:  # the plan writer needs no torch; this module does
    raise ImportError("commplan.runtime drives a plan's library from PyTorch module hooks and needs torch "
                      "(2.x with CUDA); the plan writer (commplan.plan_text, plan_from_named_parameters) does "
                      "not: %s" % e) from None

from .match import check_units_match_plan, find_plan_json, find_plan_root, load_plan_json, plan_units
from .modules import named_units, units_from_module
from .planfile import PlanError
from .validate import check_expert_counts
from . import chunked_loss, recompute, recovery, tensor_parallel, training

__all__ = ["CommplanFSDP", "GpuLibrary", "HostLibrary", "library_calls", "PlanOrderError"]

# torch >= 2.1: the gradient hooks run after accumulation and clear the unsharded parameter's .grad
_POST_ACCUMULATE = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "u8": torch.uint8}  # (u8: the raw bytes FSDP2 all-gathers for a unit of mixed all-gather dtypes)
_TYPESTR = {"fp32": "<f4", "fp16": "<f2", "bf16": "<i2", "u8": "|u1"}  # bf16 travels as int16 bits, then .view()

# One library call is a group of the plan's ops for one unit (runtime/gpu.c run_unit_ops).
CALL_KINDS = {
    "unshard": ("h2d", "copy_in", "all_gather", "copy_out"),
    "reshard": ("post_forward", "reshard"),  # (post_forward: reshard_after_forward = k keeps its slice first)
    "reduce": ("pack", "reduce_scatter", "partial_save", "partial_add", "partial_fold", "all_reduce", "view_out",
               "view_out_add", "d2h", "d2h_add"),
}


class PlanOrderError(RuntimeError):
    """A library call out of the plan's order."""


def group_calls(plan, kinds):
    """The plan's step as calls grouping its ops, in the order they must be made:
    [(call, unit_name, micro_step, phase, position)]. kinds: ((call, (op kinds in order)), ...),
    CALL_KINDS's blocking calls or commplan.overlap's SPLIT_KINDS. Each call runs its unit's next
    instance of an op group; it may be made once the ops its last op waits for have been issued,
    so calls are ordered by their last op, position (the plan op's seq)."""
    insts, open_ = [], {}
    for op in plan["ops"]:
        for call, group in kinds:
            if op["kind"] not in group:
                continue
            k = group.index(op["kind"])
            key = (op["unit"], call)
            cur = open_.get(key)
            if k == 0 or cur is None or k < cur["k"]:
                if cur is not None:
                    insts.append(cur)
                cur = open_[key] = {"call": call, "unit": op["unit"], "k": k, "last": op["seq"],
                                    "micro": op.get("micro_step", 0), "phase": op.get("phase")}
            else:
                cur["k"], cur["last"] = k, op["seq"]
            if k == len(group) - 1:
                insts.append(open_.pop(key))
    insts += open_.values()
    insts.sort(key=lambda c: c["last"])
    return [(c["call"], c["unit"], c["micro"], c["phase"], c["last"]) for c in insts]


def library_calls(plan):
    """The plan's step as blocking library calls: [(call, unit_name, micro_step, phase)] (group_calls)."""
    return [c[:4] for c in group_calls(plan, CALL_KINDS.items())]


def repeated_calls(plan):
    """[(unit name, forward calls)] of the units the model's forward calls more than once per
    micro-step: plan.json's units' forward_calls (DeepSeek-V3's multi-token prediction,
    model.num_mtp_layers > 0: tok_embeddings and [norm, lm_head] once per depth more;
    gen/models/deepseek_v3.lua calls, gen/parallel/fsdp_schedule.lua calls_micro, whose order the
    plan's ops follow). ChunkedLossWrapper's loss head, gathered once per chunk, is not one of them
    (commplan.chunked_loss drives it)."""
    return [(u["name"], u["forward_calls"]) for u in plan_units(plan) if u.get("forward_calls", 1) > 1]


# ---- the generated library through ctypes -------------------------------------------------

class _LaunchEnv(ctypes.Structure):
    """runtime/launch.h cp_launch_env."""
    _fields_ = [("rank", ctypes.c_int), ("world_size", ctypes.c_int), ("local_rank", ctypes.c_int),
                ("source", ctypes.c_char_p), ("comm_id", ctypes.c_char * 300), ("standin", ctypes.c_int),
                ("id_channel", ctypes.c_int), ("store_host", ctypes.c_char * 256), ("store_port", ctypes.c_int),
                ("id_file", ctypes.c_char * 4096), ("job_tag", ctypes.c_char * 256),
                ("init_timeout_s", ctypes.c_double)]


class _PlanHead(ctypes.Structure):
    """The first fields of runtime/commplan.h cp_plan."""
    _fields_ = [("name", ctypes.c_char_p), ("fingerprint", ctypes.c_char_p), ("world_size", ctypes.c_int)]


class _CudaArray:
    def __init__(self, ptr, numel, typestr):
        self.__cuda_array_interface__ = {"shape": (numel,), "typestr": typestr, "data": (ptr, False),
                                         "version": 2}


class _CursorDump:
    """The runtime's cursor from the bridge (issue 40, docs/diagnosis.md): with COMMPLAN_CURSOR_DUMP=PREFIX
    the library writes this process's cursor (its rank's step and op) into PREFIX<pid> on SIGUSR1
    (cp_cursor_install: a C handler, so it answers while Python waits inside a collective) and on its
    first failure (cp_host_world_stop); a call that raises writes it again with the whole line why (the
    torch.distributed error, a timeout's included), read by python -m commplan diagnose DIR PLAN."""

    def _cursor_install(self):
        if os.environ.get("COMMPLAN_CURSOR_DUMP") and hasattr(self.lib, "cp_cursor_install"):
            self.lib.cp_cursor_install.argtypes = []
            self.lib.cp_cursor_install.restype = ctypes.c_int
            if self.lib.cp_cursor_install() != 0:
                raise RuntimeError("commplan: COMMPLAN_CURSOR_DUMP: a path of at most 4000 bytes")

    def _failed(self, msg):
        """RuntimeError("commplan: " + msg), after the cursor file says where this rank is and why."""
        if os.environ.get("COMMPLAN_CURSOR_DUMP") and hasattr(self.lib, "cp_cursor_dump"):
            self.lib.cp_cursor_dump.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p]
            self.lib.cp_cursor_dump.restype = None
            low = msg.lower()
            event = b"timeout" if ("timed out" in low or "timeout" in low) else b"failure"
            self.lib.cp_cursor_dump(int(getattr(self, "rank", -1)), event, msg.encode(errors="replace")[:900])
        return RuntimeError("commplan: " + msg)


class _ExpertCalls:
    """Expert parallelism's library calls, shared by GpuLibrary and HostLibrary (cp_gpu.h's
    "Expert parallelism through the same calls"; prefix cp_gpu_ or cp_hostlib_): per experts unit,
    in the plan's order, set_expert_counts(unit, counts) (this rank's tokens per global expert)
    and the rows written into tokens(unit, 0), then exchange_tokens(unit): the counts' exchange
    and the dispatch, the rows for this rank's experts in tokens(unit, 1); the experts' output
    written over them, exchange_tokens(unit) again: the combine, back in tokens(unit, 0); the
    backward's pair likewise (output gradients into tokens(unit, 0), exchange, input gradients
    over tokens(unit, 1), exchange). Under activation checkpointing the backward starts with the
    forward's two exchanges again (the recompute: set_expert_counts with the forward's counts
    first). exchange_counts(unit) gives what the last exchange split by. A unit is its index or
    its name in plan.json."""

    _PREFIX = None

    def _ep_fn(self, name, argtypes, restype):
        fn = getattr(self.lib, self._PREFIX + name, None)
        if fn is None:
            raise PlanError("%s has no %s%s: rebuild it with make PLAN=%s.lua (this runtime's expert parallel "
                            "calls)" % (self.path, self._PREFIX, name, self.name))
        fn.argtypes, fn.restype = argtypes, restype
        return fn

    def _plan_json_loaded(self):
        if self._plan_json is None:
            self._plan_json = load_plan_json(find_plan_json(self.name))
        return self._plan_json

    def unit_index(self, unit):
        """A unit's index from its index or plan.json name."""
        if isinstance(unit, int):
            return unit
        for u in self._plan_json_loaded()["units"]:
            if u["name"] == unit:
                return u["index"]
        raise ValueError("commplan: plan %s has no unit %r" % (self.name, unit))

    def _unit_json(self, unit):
        u = self.unit_index(unit)
        for x in self._plan_json_loaded()["units"]:
            if x["index"] == u:
                return x
        raise ValueError("commplan: plan %s has no unit %d" % (self.name, u))

    def num_experts(self, unit=None):
        """The plan's global expert count (the length of set_expert_counts' list)."""
        ep = self._plan_json_loaded().get("expert_parallel") or {}
        return int(ep.get("num_experts", 0))

    def token_numel(self, unit):
        """Elements (the unit's ag dtype) of each of the unit's token buffers; 0 without all-to-alls."""
        u = self._unit_json(unit)
        nbytes = u["arena"].get("a2a_send", {}).get("bytes", 0)
        return nbytes // torch.empty(0, dtype=TORCH_DTYPES[u["ag_dtype"]]).element_size()

    def set_expert_counts(self, unit, counts):
        """This rank's tokens per global expert for the unit's next counts exchange, checked.
        Returns True, or False when they are refused: a count that is not an exact integer in
        int64 (2.5, 2.0, True, 2^64 + 1: validate.check_expert_counts; never truncated or wrapped
        as int() and ctypes would), a negative count, a member's share past the capacity, the
        wrong length. The refusal is not raised here but by the exchange_tokens that follows,
        which every member of the ep group still makes and every member then raises from (this
        rank with the refusal's own line), so none is left waiting in it."""
        u = self.unit_index(unit)
        try:
            vals = check_expert_counts(counts, "rank %d: set_expert_counts(unit %s)" % (self.rank, unit))
        except Exception as e:  # noqa: BLE001 -- any refusal still reaches the library: the exchange says it on
            # every member (a PlanError, or whatever an exotic count object raised while being read)
            refuse = self._ep_fn("refuse_expert_counts", [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p],
                                 ctypes.c_int)
            refuse(self.g, u, str(e).encode("utf-8", "replace"))
            return False
        arr = (ctypes.c_int64 * max(len(vals), 1))(*vals)
        fn = self._ep_fn("set_expert_counts", [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                               ctypes.c_int], ctypes.c_int)
        return fn(self.g, u, arr, len(vals)) == 0

    def exchange_counts(self, unit):
        """The counts the unit's last exchange split by, a torch int64 tensor (a copy) of 2 x E:
        [0, E) this rank's tokens per global expert, [E, 2E) the rows received ([source member]
        [local expert]); None before the unit's first exchange."""
        fn = self._ep_fn("exchange_counts", [ctypes.c_void_p, ctypes.c_int], ctypes.POINTER(ctypes.c_int64))
        ptr = fn(self.g, self.unit_index(unit))
        if not ptr:
            return None
        E = self.num_experts(unit)
        return torch.tensor([ptr[i] for i in range(2 * E)], dtype=torch.int64)

    def tokens(self, unit, receive):
        """The unit's send (receive 0) or receive (1) token buffer, a 1-D torch view (no copy) in
        the unit's ag dtype: rows of the plan's dim elements, packed as cp_gpu.h says."""
        u = self._unit_json(unit)
        numel = self.token_numel(unit)
        fn = self._ep_fn("tokens", [ctypes.c_void_p, ctypes.c_int, ctypes.c_int], ctypes.c_void_p)
        ptr = fn(self.g, u["index"], 1 if receive else 0)
        if not ptr or numel == 0:
            raise RuntimeError("commplan: unit %s of plan %s has no token buffers (no expert all-to-alls)"
                               % (u["name"], self.name))
        return self._token_view(ptr, numel, u["ag_dtype"])


class GpuLibrary(_ExpertCalls, _CursorDump):
    """build/<name>/lib<name>.so: cp_launch_from_env, cp_gpu_init and the per-unit calls."""

    _PREFIX = "cp_gpu_"

    REQUIRED = ("cp_launch_from_env", "cp_gpu_init", "cp_gpu_destroy", "cp_gpu_last_error", "cp_gpu_rank",
                "cp_gpu_shard_rank", "cp_gpu_sharded", "cp_gpu_unsharded", "cp_gpu_grad", "cp_gpu_sharded_grad",
                "cp_gpu_unshard", "cp_gpu_reshard", "cp_gpu_reduce_grads", "cp_gpu_synchronize")

    def __init__(self, so_path, plan_name, plan_json=None):
        self._plan_json = plan_json
        if not os.path.isfile(so_path):
            raise PlanError("%s is missing; build it with make PLAN=%s.lua (on a machine with nvcc and NCCL)"
                            % (so_path, plan_name))
        lib = ctypes.CDLL(os.path.abspath(so_path))
        missing = [f for f in self.REQUIRED if not hasattr(lib, f)]
        if missing:
            raise PlanError("%s has no GPU backend (%s missing): it was built where nvcc was not found; rebuild "
                            "with make PLAN=%s.lua where /usr/local/cuda has nvcc and NCCL"
                            % (so_path, missing[0], plan_name))
        vp, ci, cs = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        lib.cp_launch_from_env.argtypes = [vp, vp, ctypes.c_char_p, cs]
        lib.cp_launch_from_env.restype = ci
        lib.cp_gpu_init.argtypes = [ctypes.POINTER(vp), vp, vp, vp, ctypes.c_char_p, cs]
        lib.cp_gpu_init.restype = ci
        lib.cp_gpu_destroy.argtypes = [vp]
        lib.cp_gpu_destroy.restype = None
        lib.cp_gpu_last_error.argtypes = [vp]
        lib.cp_gpu_last_error.restype = ctypes.c_char_p
        for f in ("cp_gpu_rank", "cp_gpu_shard_rank"):
            getattr(lib, f).argtypes = [vp]
            getattr(lib, f).restype = ci
        for f in ("cp_gpu_sharded", "cp_gpu_unsharded", "cp_gpu_grad", "cp_gpu_sharded_grad"):
            getattr(lib, f).argtypes = [vp, ci]
            getattr(lib, f).restype = vp
        for f in ("cp_gpu_unshard", "cp_gpu_reshard", "cp_gpu_reduce_grads"):
            getattr(lib, f).argtypes = [vp, ci, vp]
            getattr(lib, f).restype = ci
        lib.cp_gpu_synchronize.argtypes = [vp, vp, ctypes.c_double]
        lib.cp_gpu_synchronize.restype = ci
        self.lib = lib
        self._fns = {"unshard": lib.cp_gpu_unshard, "reshard": lib.cp_gpu_reshard, "reduce": lib.cp_gpu_reduce_grads}
        from . import overlap
        self.split = overlap.bind(self, "cp_gpu_", True)  # the split calls (commplan.overlap)
        try:
            self._plan = ctypes.addressof(ctypes.c_char.in_dll(lib, plan_name + "_plan"))
            self._kernels = ctypes.addressof(ctypes.c_char.in_dll(lib, plan_name + "_kernels"))
        except ValueError:
            raise PlanError("%s does not hold plan %s (%s_plan / %s_kernels)" % (so_path, plan_name, plan_name,
                                                                              plan_name)) from None
        head = _PlanHead.from_address(self._plan)
        self.fingerprint = head.fingerprint.decode()
        self.lib, self.path, self.name, self.g = lib, so_path, plan_name, None
        self.device = None

    def init(self):
        err = ctypes.create_string_buffer(4096)
        env = _LaunchEnv()
        getenv = ctypes.cast(ctypes.CDLL(None).getenv, ctypes.c_void_p)
        if self.lib.cp_launch_from_env(ctypes.byref(env), getenv, err, len(err)) != 0:
            raise RuntimeError("commplan: " + err.value.decode(errors="replace"))
        # The library sets its device to LOCAL_RANK; torch must allocate and run on the same one.
        self.device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(self.device)
        g = ctypes.c_void_p()
        if self.lib.cp_gpu_init(ctypes.byref(g), self._plan, self._kernels, ctypes.byref(env), err, len(err)) != 0:
            raise RuntimeError("commplan: " + err.value.decode(errors="replace"))
        self.g = g
        self.rank = self.lib.cp_gpu_rank(g)
        self.shard_rank = self.lib.cp_gpu_shard_rank(g)
        self._cursor_install()

    def tensor(self, kind, param, numel, dtype, host=False):
        """A 1-D torch view of `numel` elements of param's storage: kind is sharded, unsharded, grad
        or sharded_grad (runtime/cp_gpu.h). host: the storage is host memory (CPU offload: an
        offloading unit's sharded params and grads, as FSDP2's CPUOffloadPolicy keeps them; the
        optimizer then steps them on the CPU)."""
        if numel == 0:
            return torch.empty(0, dtype=TORCH_DTYPES[dtype], device="cpu" if host else self.device)
        ptr = getattr(self.lib, "cp_gpu_" + kind)(self.g, param)
        if not ptr:
            raise RuntimeError("commplan: cp_gpu_%s(%d) returned NULL" % (kind, param))
        if host:
            tdt = TORCH_DTYPES[dtype]
            buf = (ctypes.c_char * (numel * torch.empty(0, dtype=tdt).element_size())).from_address(ptr)
            return torch.frombuffer(buf, dtype=tdt, count=numel)
        t = torch.as_tensor(_CudaArray(ptr, numel, _TYPESTR[dtype]), device=self.device)
        return t.view(torch.bfloat16) if dtype == "bf16" else t

    def stream(self):
        return torch.cuda.current_stream(self.device).cuda_stream

    def _token_view(self, ptr, numel, dtype):
        t = torch.as_tensor(_CudaArray(ptr, numel, _TYPESTR[dtype]), device=self.device)
        return t.view(torch.bfloat16) if dtype == "bf16" else t

    def exchange_tokens(self, unit):
        """The unit's next token exchange on torch's current stream (cp_gpu_exchange_tokens)."""
        fn = self._ep_fn("exchange_tokens", [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p], ctypes.c_int)
        if fn(self.g, self.unit_index(unit), ctypes.c_void_p(self.stream())) != 0:
            raise self._failed(self.last_error())

    def call(self, call, unit):
        if self._fns[call](self.g, unit, ctypes.c_void_p(self.stream())) != 0:
            raise self._failed(self.last_error())

    def last_error(self):
        msg = self.lib.cp_gpu_last_error(self.g)
        return msg.decode(errors="replace") if msg else "(no message)"

    def synchronize(self, timeout_s):
        if self.lib.cp_gpu_synchronize(self.g, ctypes.c_void_p(self.stream()), float(timeout_s)) != 0:
            raise self._failed(self.last_error())

    def close(self):
        if self.g is not None:
            self.lib.cp_gpu_destroy(self.g)
            self.g = None


_COLLECTIVE_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                  ctypes.c_int, ctypes.c_int)
# host.h cp_host_alltoall_cb: (user, family, color, key, size, in, out, send_rows, recv_rows, row_bytes)
_ALLTOALL_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64),
                                ctypes.POINTER(ctypes.c_int64), ctypes.c_int64)
_DTYPE_CODES = ("fp32", "bf16", "fp16", "u8")  # cp_dtype (u8: a mixed-dtype unit's raw-byte all-gather)
_COLL_ALL_GATHER, _COLL_REDUCE_SCATTER, _COLL_ALL_REDUCE = 0, 1, 2  # cp_collective


class HostLibrary(_ExpertCalls, _CursorDump):
    """build/<name>/lib<name>.so without a GPU (runtime/cp_hostlib.h): this rank of the plan over
    host memory, the same executor, buffers, copies and per-unit calls as the NCCL backend, and
    every collective a torch.distributed call (gloo) on the process group of the op's group
    instance. Made after torch.distributed.init_process_group; every rank makes its groups in
    the same order (one per instance of each family the plan uses). Expert parallelism's token
    all-to-alls are dist.all_to_all_single on the ep group's process group, with the rows' split
    sizes (the counts' exchange: one row of int64 per member)."""

    _PREFIX = "cp_hostlib_"

    REQUIRED = ("cp_hostlib_init", "cp_hostlib_destroy", "cp_hostlib_last_error", "cp_hostlib_rank",
                "cp_hostlib_shard_rank", "cp_hostlib_group_member", "cp_hostlib_sharded", "cp_hostlib_unsharded",
                "cp_hostlib_grad", "cp_hostlib_sharded_grad", "cp_hostlib_unshard", "cp_hostlib_reshard",
                "cp_hostlib_reduce_grads")

    def __init__(self, so_path, plan_name, plan_json=None):
        if not os.path.isfile(so_path):
            raise PlanError("%s is missing; build it with make PLAN=%s.lua" % (so_path, plan_name))
        lib = ctypes.CDLL(os.path.abspath(so_path))
        missing = [f for f in self.REQUIRED if not hasattr(lib, f)]
        if missing:
            raise PlanError("%s has no host library (%s missing): rebuild it with make PLAN=%s.lua"
                            % (so_path, missing[0], plan_name))
        vp, ci, cs = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        lib.cp_hostlib_init.argtypes = [ctypes.POINTER(vp), vp, ci, _COLLECTIVE_CB, vp, ctypes.c_char_p, cs]
        lib.cp_hostlib_init.restype = ci
        lib.cp_hostlib_destroy.argtypes = [vp]
        lib.cp_hostlib_destroy.restype = None
        lib.cp_hostlib_last_error.argtypes = [vp]
        lib.cp_hostlib_last_error.restype = ctypes.c_char_p
        for f in ("cp_hostlib_rank", "cp_hostlib_shard_rank"):
            getattr(lib, f).argtypes = [vp]
            getattr(lib, f).restype = ci
        lib.cp_hostlib_group_member.argtypes = [vp, ci, ci, ci]
        lib.cp_hostlib_group_member.restype = ci
        for f in ("cp_hostlib_sharded", "cp_hostlib_unsharded", "cp_hostlib_grad", "cp_hostlib_sharded_grad"):
            getattr(lib, f).argtypes = [vp, ci]
            getattr(lib, f).restype = vp
        for f in ("cp_hostlib_unshard", "cp_hostlib_reshard", "cp_hostlib_reduce_grads"):
            getattr(lib, f).argtypes = [vp, ci]
            getattr(lib, f).restype = ci
        self.lib = lib
        self._fns = {"unshard": lib.cp_hostlib_unshard, "reshard": lib.cp_hostlib_reshard,
                     "reduce": lib.cp_hostlib_reduce_grads}
        from . import overlap
        self.split = overlap.bind(self, "cp_hostlib_", False)  # the split calls (commplan.overlap)
        self._async = None  # overlap.AsyncCollectives once init made this rank
        self._views = {}
        try:
            self._plan = ctypes.addressof(ctypes.c_char.in_dll(lib, plan_name + "_plan"))
        except ValueError:
            raise PlanError("%s does not hold plan %s (%s_plan)" % (so_path, plan_name, plan_name)) from None
        self.fingerprint = _PlanHead.from_address(self._plan).fingerprint.decode()
        self.lib, self.path, self.name, self.g = lib, so_path, plan_name, None
        self.device = torch.device("cpu")
        self._plan_json = plan_json
        self._groups = {}
        self._error = None
        self._cb = _COLLECTIVE_CB(self._collective)  # kept alive as long as the library
        self._a2a_cb = _ALLTOALL_CB(self._alltoall)

    def init(self):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("commplan: HostLibrary needs torch.distributed.init_process_group first")
        err = ctypes.create_string_buffer(4096)
        g = ctypes.c_void_p()
        if self.lib.cp_hostlib_init(ctypes.byref(g), self._plan, dist.get_rank(), self._cb, None, err, len(err)) != 0:
            raise RuntimeError("commplan: " + err.value.decode(errors="replace"))
        self.g = g
        self.rank = self.lib.cp_hostlib_rank(g)
        self.shard_rank = self.lib.cp_hostlib_shard_rank(g)
        self._cursor_install()
        if hasattr(self.lib, "cp_hostlib_set_alltoall"):  # a library from before it refuses exchanges itself
            self.lib.cp_hostlib_set_alltoall.argtypes = [ctypes.c_void_p, _ALLTOALL_CB, ctypes.c_void_p]
            self.lib.cp_hostlib_set_alltoall.restype = None
            self.lib.cp_hostlib_set_alltoall(g, self._a2a_cb, None)
        if self.split and hasattr(self.lib, "cp_hostlib_set_async"):
            from . import overlap
            self._async = overlap.AsyncCollectives(self)
        # One process group per instance of every family the plan's collectives use, made in the
        # same order on every rank (new_group is collective).
        plan = self._plan_json_loaded()
        used = {op["group"] for op in plan["ops"] if op.get("group")}
        for f in sorted(plan["groups"], key=lambda f: f["id"]):  # the C tables' family order
            fi = f["id"]
            if f["name"] not in used or f["size"] < 2:
                continue
            for color in range(plan["world_size"] // f["size"]):
                ranks = [self.lib.cp_hostlib_group_member(g, fi, color, k) for k in range(f["size"])]
                pg = dist.new_group(ranks)
                if self.rank in ranks:
                    self._groups[(fi, color)] = pg

    def _view(self, ptr, numel, dtype):
        # the plan's buffers never move (a fixed arena): one view per (pointer, length, dtype)
        key = (ptr, numel, dtype)
        v = self._views.get(key)
        if v is None:
            dt = TORCH_DTYPES[_DTYPE_CODES[dtype]]
            if numel == 0:
                v = torch.empty(0, dtype=dt)
            else:
                es = torch.empty(0, dtype=dt).element_size()
                v = torch.frombuffer((ctypes.c_char * (numel * es)).from_address(ptr), dtype=dt)
            self._views[key] = v
        return v

    def _collective(self, user, coll, family, color, key, size, inp, out, count, dtype, reduce_op):
        """torch.distributed's collective for one of the plan's: the executor's pointers as
        tensors (no copy), on the instance's process group."""
        import torch.distributed as dist
        try:
            pg = self._groups[(family, color)]
            op = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX)[reduce_op]
            # a split call's collective may run on (async_op=True: gloo's threads) until the library
            # waits for its ticket (commplan.overlap.AsyncCollectives)
            t = self._async.ticket(self.g) if self._async is not None else 0
            if coll == _COLL_ALL_GATHER:
                o = self._view(out, count * size, dtype)
                i = o[key * count:(key + 1) * count].clone() if inp == out + key * count * o.element_size() \
                    else self._view(inp, count, dtype)
                work = dist.all_gather_into_tensor(o, i, group=pg, async_op=bool(t))
            elif coll == _COLL_REDUCE_SCATTER:
                o, i = self._view(out, count, dtype), self._view(inp, count * size, dtype)
                work = dist.reduce_scatter_tensor(o, i, op=op, group=pg, async_op=bool(t))
            else:
                o = i = self._view(out, count, dtype)
                if inp != out:
                    o.copy_(self._view(inp, count, dtype))
                work = dist.all_reduce(o, op=op, group=pg, async_op=bool(t))
            if t:
                self._async.add(t, work, (o, i), coll)
            return 0
        except Exception as e:  # noqa: BLE001 - reported through last_error, never across the C frame
            self._error = "torch.distributed %s on group %d/%d failed: %s: %s" % (
                ("all_gather", "reduce_scatter", "all_reduce")[coll], family, color, type(e).__name__, e)
            return -1

    def _alltoall(self, user, family, color, key, size, inp, out, send_rows, recv_rows, row_bytes):
        """torch.distributed.all_to_all_single for one of the plan's exchanges: member m's rows
        back to back in inp and out (split sizes in rows of row_bytes), on the instance's group.
        Rows travel as the widest integer dividing row_bytes (the counts: int64)."""
        import torch.distributed as dist
        try:
            pg = self._groups[(family, color)]
            dt = next(d for d in (torch.int64, torch.int32, torch.int16, torch.uint8)
                      if row_bytes % torch.empty(0, dtype=d).element_size() == 0)
            es = torch.empty(0, dtype=dt).element_size()
            per = row_bytes // es  # elements per row
            send = [int(send_rows[m]) * per for m in range(size)]
            recv = [int(recv_rows[m]) * per for m in range(size)]

            def view(ptr, n):
                if n == 0:
                    return torch.empty(0, dtype=dt)
                return torch.frombuffer((ctypes.c_char * (n * es)).from_address(ptr), dtype=dt)
            dist.all_to_all_single(view(out, sum(recv)), view(inp, sum(send)), output_split_sizes=recv,
                                   input_split_sizes=send, group=pg)
            return 0
        except Exception as e:  # noqa: BLE001 - reported through last_error, never across the C frame
            self._error = "torch.distributed all_to_all_single on group %d/%d failed: %s: %s" % (
                family, color, type(e).__name__, e)
            return -1

    def _token_view(self, ptr, numel, dtype):
        return self._view(ptr, numel, _DTYPE_CODES.index(dtype))

    def exchange_tokens(self, unit):
        """The unit's next token exchange (cp_hostlib_exchange_tokens), synchronous."""
        fn = self._ep_fn("exchange_tokens", [ctypes.c_void_p, ctypes.c_int], ctypes.c_int)
        if fn(self.g, self.unit_index(unit)) != 0:
            raise self._failed(self.last_error())

    def group_members(self, family, color):
        """Global ranks of instance `color` of family `family` (plan.json's group id), in key order."""
        size = next(f["size"] for f in self._plan_json_loaded()["groups"] if f["id"] == family)
        return [self.lib.cp_hostlib_group_member(self.g, family, color, k) for k in range(size)]

    def tensor(self, kind, param, numel, dtype, host=False):
        """A 1-D torch view (no copy) of `numel` elements of param's storage: kind is sharded,
        unsharded, grad or sharded_grad (runtime/cp_hostlib.h); host: CPU offload's host storage,
        which every storage of this library already is."""
        if numel == 0:
            return torch.empty(0, dtype=TORCH_DTYPES[dtype])
        ptr = getattr(self.lib, "cp_hostlib_" + kind)(self.g, param)
        if not ptr:
            raise RuntimeError("commplan: cp_hostlib_%s(%d) returned NULL" % (kind, param))
        # a tensor of its own, not the collectives' cached view: the plan's arena may place one
        # parameter's storage where another's lived earlier in the step (the same pointer and
        # length), and a shared tensor would share autograd's version counter, so a write of the
        # one would fail the backward of a tensor saved from the other
        es = torch.empty(0, dtype=TORCH_DTYPES[dtype]).element_size()
        return torch.frombuffer((ctypes.c_char * (numel * es)).from_address(ptr), dtype=TORCH_DTYPES[dtype])

    def call(self, call, unit):
        if self._fns[call](self.g, unit) != 0:
            raise self._failed(self.last_error())

    def last_error(self):
        if self._error:
            e, self._error = self._error, None
            msg = self.lib.cp_hostlib_last_error(self.g)
            return e + ("; " + msg.decode(errors="replace") if msg else "")
        msg = self.lib.cp_hostlib_last_error(self.g)
        return msg.decode(errors="replace") if msg else "(no message)"

    def synchronize(self, timeout_s):
        """Waits for this rank's communication: the blocking calls are synchronous, but under overlap
        prefetched all-gathers and reductions may still be in flight on gloo (commplan.overlap)."""
        if self._async is not None:
            self._async.drain()

    def close(self):
        if self._async is not None:
            self._async.drain()  # no collective may still write into the buffers freed below
        if self.g is not None:
            self.lib.cp_hostlib_destroy(self.g)
            self.g = None


# ---- FSDP from a plan ---------------------------------------------------------------------

def _shard_of(full, W, r, k, valid_shape):
    chunks = torch.chunk(full, W, dim=k)
    if r < len(chunks):
        return chunks[r]
    return full.new_empty(valid_shape)


def _tensors_in(obj, out):
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors_in(x, out)
    return out


def _eval_cast(unit, args, kwargs, with_kwargs):
    if unit["cast"]:
        args = _cast_floats(args, unit["ag_dtype"])
        kwargs = _cast_floats(kwargs, unit["ag_dtype"]) if with_kwargs else kwargs
    return (args, kwargs) if with_kwargs else args


def _cast_floats(obj, dtype):
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype else obj
    if isinstance(obj, tuple):
        return tuple(_cast_floats(x, dtype) for x in obj)
    if isinstance(obj, list):
        return [_cast_floats(x, dtype) for x in obj]
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj


class _PostBackward(torch.autograd.Function):
    """FSDP2's RegisterPostBackwardFunction (torch 2.15 _fsdp_state.py) for a unit with frozen
    parameters (requires_grad=False): its trainable parameters' gradients can all arrive while a
    frozen one is still needed for its inputs' gradient, so, as in FSDP2, the backward through its
    inputs starts its post-backward (reshard, then the plan's reduction), not the last gradient."""

    @staticmethod
    def forward(ctx, fn, *xs):
        ctx.fn = fn
        out = tuple(x.view_as(x) for x in xs)
        return out if len(out) > 1 else out[0]

    @staticmethod
    def backward(ctx, *gs):
        ctx.fn()
        return (None,) + gs


def _post_backward_inputs(args, fn):
    """args with its tensors that need a gradient passed through _PostBackward (fn once)."""
    idx = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not idx:
        return args
    out = _PostBackward.apply(fn, *[args[i] for i in idx])
    out = out if isinstance(out, tuple) else (out,)
    args = list(args)
    for i, t in zip(idx, out):
        args[i] = t
    return tuple(args)


class _Param:
    __slots__ = ("index", "fqn", "unit", "owners", "sharded", "unsharded", "grad_buf", "shard_grad", "alias",
                 "accumulated", "arrived", "requires_grad")


class CommplanFSDP:
    """FSDP2 for `model` under `units` (its fully_shard calls in order, as plan_from_module takes
    them), driven by the generated plan `plan` (a name under plans/ or built by make PLAN=path).

    root: the commplan checkout (plans/, build/); None: the working directory or the checkout this
    package comes from, whichever holds the plan (commplan.match.find_plan_root). library: a loaded library object (tests pass a
    host stand-in). shard_dim: as plan_from_module's. check_order: refuse library calls out of
    the plan's order (leave on). overlap: prefetch unshards and leave reductions in flight as FSDP2
    does (commplan.overlap; False: every call blocking). Call close() when done (frees the plan's
    GPU memory)."""

    def __init__(self, plan, model, units, root=None, plan_json=None, library=None, shard_dim=None,
                 check_order=True, overlap=True):
        self.name = plan
        if plan_json is None:
            root, plan_json = find_plan_root(plan, root)
        root = root if root is not None else "."
        self.plan = load_plan_json(plan_json)
        self.model = model
        wrapped = units_from_module(model, units)
        if self.plan.get("parallel", {}).get("tp", 1) != 1:  # the model's TP layout first (tensor_parallel)
            self.plan = tensor_parallel.check_model(self.plan, wrapped)  # as this rank's TP class holds it
        check_units_match_plan(named_units(model, units, shard_dim), self.plan)
        if self.plan.get("fsdp", {}).get("grad_accumulation") == "step_end":
            raise PlanError("plan %s accumulates as torch.distributed.pipelining does (grad_accumulation = "
                            "\"step_end\"): its units stay unsharded across micro-batches, which FSDP2's module "
                            "hooks here do not model; use fsdp2_default, sync_last or all_reduce_last" % plan)
        # (requires_grad=False is the plan's frozen: check_units_match_plan compared them above)
        self.lib = library if library is not None else GpuLibrary(
            os.path.join(root, "build", plan, "lib%s.so" % plan), plan)
        if getattr(self.lib, "fingerprint", self.plan["fingerprint"]) != self.plan["fingerprint"]:
            raise PlanError("lib%s.so (fingerprint %s) and plan.json (%s) come from different generations of plan "
                            "%s; rebuild with make PLAN=%s.lua" % (plan, self.lib.fingerprint,
                                                                   self.plan["fingerprint"], plan, plan))
        if getattr(self.lib, "g", None) is None:
            self.lib.init()
        self.check_order = check_order
        self._build(model, wrapped)
        self._tp = tensor_parallel.attach(self, wrapped)  # FSDP/HSDP x TP; None without TP
        calls = library_calls(self.plan)
        self._calls = [(c, self._unit_index[u], m) for c, u, m, _ in calls]
        self._micro_steps = self.plan["fsdp"].get("micro_steps", 1)
        self._micro_end = [sum(1 for c in self._calls if c[2] <= m) for m in range(self._micro_steps)]
        self._plan_calls = {(c, self._unit_index[u], m, ph) for c, u, m, ph in calls}
        # (unit, micro-step) whose reduction adds into the plan's sharded-grads storage
        # (view_out_add: FSDP2's default accumulation, a later reduction of the step)
        # (d2h_add: the same on an offloading unit, added on the host)
        self._reduce_adds = {(self._unit_index[op["unit"]], op.get("micro_step", 0))
                             for op in self.plan["ops"] if op["kind"] in ("view_out_add", "d2h_add")}
        # CPU offload: some unit's sharded grads are host memory, filled by D2H copies
        self._offloads = any(u.get("cpu_offload") for u in self.plan["units"])
        # (unit, micro-step) whose reduction ends in the sharded grads; under all_reduce_last the
        # earlier ones end in the plan's partial sums (HSDP's set_requires_all_reduce(False))
        self._reduce_views = {(self._unit_index[op["unit"]], op.get("micro_step", 0))
                              for op in self.plan["ops"] if op["kind"] in ("view_out", "view_out_add")}
        self._overlap = None
        if overlap and getattr(self.lib, "split", False):
            from .overlap import Overlap
            self._overlap = Overlap(self)  # the split calls' order replaces _calls
        self._pos = 0
        self._micro = 0
        # torchtitan's ChunkedLossWrapper on the plan's loss head (training.loss_chunks >= 2), else None
        self._head = chunked_loss.attach(self)
        self._reset_pass()
        self._eval = training.EvalForward(self)
        self._install_hooks()
        training.register(self)

    # -- setup --

    def _build(self, model, wrapped):
        punits = plan_units(self.plan)
        self._unit_index = {u["name"]: u["index"] for u in punits}
        self.units = []  # in plan table order (root first)
        # Wrapping order (root last) -> table order (root first): the plan's unit index.
        order = [wrapped[-1]] + wrapped[:-1]
        owners = {}
        for mod in model.modules():
            for attr, p in mod._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), []).append((mod, attr))
        W = self.plan["parallel"]["dp_shard"]
        r = self.lib.shard_rank
        pindex = 0
        self.params = []
        for (u, params), pu in zip(order, punits):
            ag, orig = pu["ag_dtype"], pu["orig_dtype"]
            unit = {"name": pu["name"], "index": pu["index"], "modules": u.modules, "params": [],
                    "reshard_after_forward": pu["reshard_after_forward"], "root": pu.get("root", False),
                    "reshard_after_backward": pu.get("reshard_after_backward", True),
                    # set_unshard_in_backward(False) on a unit resharded after forward: its backward runs
                    # on the sharded parameters, its pre-backward gathers nothing (gen/parallel/fsdp_layout.lua)
                    "sharded_backward": pu.get("unshard_in_backward") is False and bool(pu["reshard_after_forward"])
                    and not pu.get("root", False),
                    "ag_dtype": TORCH_DTYPES[ag], "cast": ag != orig,
                    # forward calls per micro-step (> 1: FSDP2's hooks per call, module docstring)
                    "calls": pu.get("forward_calls", 1)}
            for (fqn, p), meta in zip(params, pu["params"]):
                k, shape, chunk = meta.get("shard_dim", 0), list(meta["shape"]), meta["chunk"]
                valid = max(0, min(chunk, shape[k] - r * chunk))
                local = shape[:k] + [valid] + shape[k + 1:]
                nvalid = 1
                for d in local:
                    nvalid *= d
                numel = meta["numel"]
                P = _Param()
                P.index, P.fqn, P.unit, P.owners = pindex, fqn, pu["index"], owners[id(p)]
                P.requires_grad = p.requires_grad
                # CPU offload (plan.json's unit cpu_offload): the shards and their grads in host memory
                host = {"host": True} if pu.get("cpu_offload") else {}
                flat = self.lib.tensor("sharded", pindex, meta["padded_numel"], meta["dtype"], **host)
                with torch.no_grad():
                    flat.zero_()
                    if not p.is_meta:
                        flat[:nvalid].view(local).copy_(_shard_of(p.detach(), W, r, k, local))
                P.sharded = nn.Parameter(flat[:nvalid].view(local), requires_grad=p.requires_grad)
                P.unsharded = nn.Parameter(self.lib.tensor("unsharded", pindex, numel, meta.get("ag_dtype", ag)).view(shape),
                                           requires_grad=p.requires_grad)
                # in the unit's grad_dtype (torch 2.15's grad_dtype of the unsharded parameter:
                # copy_ casts the first micro-batch's gradient, add_ sums later ones there)
                # (a frozen parameter, requires_grad=False: no gradient, so the plan keeps no grad
                # storage for it and never reduces it; match.py checked the model agrees)
                P.grad_buf = P.shard_grad = None
                if not meta.get("frozen"):
                    P.grad_buf = self.lib.tensor("grad", pindex, numel, pu.get("grad_dtype", ag)).view(shape)
                    P.shard_grad = self.lib.tensor("sharded_grad", pindex, meta["padded_numel"],
                                                   meta["dtype"], **host)[:nvalid].view(local)
                P.alias = None
                P.accumulated = False
                P.arrived = False
                for mod, attr in P.owners:
                    mod._parameters[attr] = P.sharded
                unit["params"].append(P)
                self.params.append(P)
                pindex += 1
            # _use's assignments, made once (host time: one list walk per unit and call)
            unit["use"] = {flag: [(mod._parameters, attr, P.unsharded if flag else P.sharded)
                                  for P in unit["params"] for mod, attr in P.owners] for flag in (True, False)}
            unit["n_grads"] = sum(1 for P in unit["params"] if P.requires_grad)
            unit["frozen"] = unit["n_grads"] < len(unit["params"])
            self.units.append(unit)
        self.live = [False] * len(self.units)

    def _install_hooks(self):
        self._handles = []
        for unit in self.units:
            u = unit["index"]
            for mod in unit["modules"]:
                try:
                    h = mod.register_forward_pre_hook(self._pre_forward_hook(u), with_kwargs=True)
                except TypeError:  # torch < 2.0: positional arguments only
                    h = mod.register_forward_pre_hook(self._pre_forward_hook(u, False))
                self._handles.append(h)
                self._handles.append(mod.register_forward_hook(self._post_forward_hook(u)))
            for P in unit["params"]:
                if not P.requires_grad:
                    continue
                if hasattr(P.unsharded, "register_post_accumulate_grad_hook"):
                    self._handles.append(P.unsharded.register_post_accumulate_grad_hook(self._grad_hook(P, True)))
                else:
                    self._handles.append(P.unsharded.register_hook(self._grad_hook(P, False)))

    # -- state --

    def _reset_pass(self):
        if getattr(self, "_head", None) is not None:
            self._head.new_micro_step()
        self._in_backward = False
        self._callback_queued = False
        self._fwd_started = [0] * len(getattr(self, "units", []))
        self._fwd_done = [0] * len(getattr(self, "units", []))
        self._pre_bwd_done = [False] * len(getattr(self, "units", []))
        self._post_bwd_done = [False] * len(getattr(self, "units", []))
        self._arrived = [0] * len(getattr(self, "units", []))
        self._pb_pending = [0] * len(getattr(self, "units", []))  # calls' input post-backwards not yet run

    def _call(self, call, u, lib_call=None):
        if self.check_order:
            exp = self._calls[self._pos] if self._pos < len(self._calls) else None
            if exp is None or exp[0] != call or exp[1] != u:
                want = "nothing more this micro-step" if exp is None else "%s(%s)" % (exp[0], self.units[exp[1]]["name"])
                raise PlanOrderError(
                    "commplan: %s(%s) called, but plan %s expects %s next (micro-step %d; the op order of its "
                    "SCHEDULE.md): the model runs its units in another order than the plan (a unit called twice, "
                    "a loss other than the one training.loss_chunks says, a forward under no_grad)"
                    % (call, self.units[u]["name"], self.name, want, self._micro))
        self._pos += 1
        self.lib.call(lib_call or call, u)

    def _use(self, unit, unsharded):
        for params, attr, t in unit["use"][unsharded]:
            params[attr] = t

    def _unshard(self, u, phase="forward"):
        if self._overlap is not None:
            return self._overlap.unshard(u, phase)
        unit = self.units[u]
        if not self.live[u]:
            if unit["params"]:
                self._call("unshard", u)
            self.live[u] = True
        self._use(unit, True)

    def _reshard(self, u, phase):
        unit = self.units[u]
        if unit["params"] and ("reshard", u, self._micro, phase) in self._plan_calls:
            self._call("reshard", u)
        elif unit["params"] and phase == "backward" and unit["reshard_after_backward"] is False:
            return  # set_reshard_after_backward(False): unsharded into the next forward, which gathers nothing
        self.live[u] = False
        self._use(unit, False)

    # -- forward --

    def _pre_forward_hook(self, u, with_kwargs=True):
        def hook(module, args, kwargs=None):
            if not torch.is_grad_enabled():  # evaluation: gathered apart from the plan (training.py)
                self._eval.pre_forward(u)
                return _eval_cast(self.units[u], args, kwargs, with_kwargs)
            if u == 0 and recovery.unfinished(self):  # the previous pass raised: start anew, as FSDP2
                recovery.reset_step(self)
            if self._in_backward:  # activation checkpointing's recompute: no call (commplan.recompute)
                recompute.recompute_pre_forward(self, u)
                return _eval_cast(self.units[u], args, kwargs, with_kwargs)
            if self._head is not None and self._head.in_loss(u):  # a ChunkedLossWrapper chunk (chunked_loss)
                self._head.pre_forward(u)
                return _eval_cast(self.units[u], args, kwargs, with_kwargs)
            unit = self.units[u]
            if unit["calls"] > 1:
                return self._pre_forward_call(u, args, kwargs, with_kwargs)
            if self._fwd_done[u] >= len(unit["modules"]):
                raise PlanOrderError("commplan: a second forward of %s before backward: the plan's micro-step is "
                                     "one forward and one backward (torchtitan's ChunkedLossWrapper runs lm_head once "
                                     "per chunk: write the plan with training.loss_chunks = its num_chunks; "
                                     "DeepSeek-V3's multi-token prediction calls tok_embeddings once per depth more: "
                                     "write it with the model's num_mtp_layers; after an exception in a backward: "
                                     "fsdp.reset_step())"
                                     % unit["name"])
            if self._fwd_started[u] == 0:
                if u == 0 and not _POST_ACCUMULATE:
                    for P in self.params:  # torch < 2.1 left the last backward's grads on the unsharded params
                        P.unsharded.grad = None
                self._unshard(u)
            self._fwd_started[u] += 1
            if unit["frozen"] and self._fwd_started[u] == 1:
                # frozen parameters: its post-backward starts from its inputs' gradient
                args = _post_backward_inputs(args, lambda: None if self._post_bwd_done[u] else self._post_backward(u))
            if unit["cast"]:
                args = _cast_floats(args, unit["ag_dtype"])
                if with_kwargs:
                    kwargs = _cast_floats(kwargs, unit["ag_dtype"])
            return (args, kwargs) if with_kwargs else args
        return hook

    def _post_forward_hook(self, u):
        def hook(module, args, output):
            if not torch.is_grad_enabled():
                return self._eval.post_forward(u)
            if self._in_backward:
                return recompute.recompute_post_forward(self, u)
            if self._head is not None and self._head.in_loss(u):
                return None
            unit = self.units[u]
            for t in _tensors_in(output, []):
                if t.requires_grad:
                    t.register_hook(self._pre_backward_hook(u))
            self._fwd_done[u] += 1
            n = len(unit["modules"])
            last = self._fwd_done[u] % n == 0 if unit["calls"] > 1 else self._fwd_done[u] == n  # (of the call)
            if last and u != 0 and unit["reshard_after_forward"]:
                self._reshard(u, "forward")
            if u == 0:  # units whose modules did not all run (lm_head under _skip_lm_head): chunked_loss
                chunked_loss.complete_forward(self, output, self._pre_backward_hook)
            return None
        return hook

    def _pre_forward_call(self, u, args, kwargs, with_kwargs):
        """The pre-forward of a unit called `calls` times per micro-step, per module call:
        FSDP2's pre_forward per call (_fsdp_param_group.py:637-651): unshard where resharded (a
        no-op while unsharded), the first module of each call registering the call's post-backward
        on its inputs (RegisterPostBackwardFunction, :1158-1172, run by _post_backward_call)."""
        unit = self.units[u]
        n = len(unit["modules"])
        if self._fwd_done[u] >= n * unit["calls"]:
            raise PlanOrderError("commplan: forward call %d of %s, whose plan calls it %d times per micro-step "
                                 "(plan.json's forward_calls: model.num_mtp_layers); write the plan with the "
                                 "model's num_mtp_layers" % (self._fwd_done[u] // n + 1, unit["name"], unit["calls"]))
        first = self._fwd_started[u] % n == 0
        if first:
            self._unshard(u)
        self._fwd_started[u] += 1
        if first:
            before = args
            args = _post_backward_inputs(args, lambda: self._post_backward_call(u))
            self._pb_pending[u] += args is not before
        if unit["cast"]:
            args = _cast_floats(args, unit["ag_dtype"])
            if with_kwargs:
                kwargs = _cast_floats(kwargs, unit["ag_dtype"])
        return (args, kwargs) if with_kwargs else args

    def _post_backward_call(self, u):
        """One call's post-backward (its inputs' gradient), for a unit called more than once: FSDP2's
        post_backward (_fsdp_param_group.py:695-730) reshards, and reduces only the unsharded
        gradients it finds: before the last gradient arrived, a reshard alone (and the next call's
        pre-backward gathers again, its state no longer PRE_BACKWARD, :679-681); after it, the
        unit's post-backward (reshard, reduce)."""
        self._pb_pending[u] -= 1
        if self._post_bwd_done[u]:
            return
        if self._arrived[u] == self.units[u]["n_grads"]:
            self._post_backward(u)
            return
        if self.live[u]:
            self._reshard(u, "backward")
        self._pre_bwd_done[u] = False

    # -- backward --

    def _enter_backward(self):
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True
            self._in_backward = True

    def _pre_backward_hook(self, u):
        def hook(grad):
            self._enter_backward()
            if not self._pre_bwd_done[u]:
                self._pre_bwd_done[u] = True
                if not self.units[u]["sharded_backward"]:
                    self._unshard(u, "backward")
                elif self._overlap is not None:  # (only the prefetches the plan issues there)
                    self._overlap.prefetch(u, "backward")
            return None
        return hook

    def _grad_hook(self, P, post_accumulate):
        def hook(arg):
            in_loss = self._head is not None and self._head.in_loss(P.unit)  # a chunk's backward
            if not in_loss:
                self._enter_backward()
            g = arg.grad if post_accumulate else arg
            with torch.no_grad():
                # cast to the buffer's dtype first, then added in it: AccumulateGrad with the
                # unsharded parameter's grad_dtype, as torch 2.15's FSDP2 sets it
                if P.accumulated:
                    P.grad_buf.add_(g.to(P.grad_buf.dtype))
                else:
                    P.grad_buf.copy_(g)
            P.accumulated = True
            if post_accumulate:
                arg.grad = None
            if in_loss:
                self._head.chunk_grad(P)
                return None
            if not P.arrived:
                P.arrived = True
                self._arrived[P.unit] += 1
                unit = self.units[P.unit]
                if self._arrived[P.unit] == unit["n_grads"] and not unit["frozen"] \
                        and not (unit["calls"] > 1 and self._pb_pending[P.unit]):
                    # (a unit with frozen parameters, or a repeated unit whose calls' inputs have yet to run
                    # their backward: _PostBackward)
                    self._post_backward(P.unit)
            return None
        return hook

    def _post_backward(self, u):
        unit = self.units[u]
        self._post_bwd_done[u] = True
        self._reshard(u, "backward")
        if not unit["params"] or ("reduce", u, self._micro, "backward") not in self._plan_calls:
            return
        # the loss head's last part (its norm) under ChunkedLossWrapper, else the whole unit
        self._reduce(u, self._head.next_part() if self._head is not None and self._head.u == u else unit["params"])

    def _reduce(self, u, params):
        """The unit's next reduction (of `params`: the unit's, or the part the plan reduces; its
        frozen ones, requires_grad=False, have no gradient and take no part): issued
        and left in flight under overlap (commplan.overlap, waited later), else made at once."""
        params = [P for P in params if P.grad_buf is not None]
        if self._head is not None and self._head.u == u:
            self._head.reduced()
        if self._overlap is not None:
            return self._overlap.reduce(u, params)
        self._before_reduce(u, (u, self._micro) in self._reduce_adds, params)
        self._call("reduce", u)
        self._after_reduce(u, params)

    def _before_reduce(self, u, adds, params):
        with torch.no_grad():
            for P in params:
                aliased = P.alias is not None and P.sharded.grad is P.alias
                if adds and not aliased:
                    # the plan adds this reduction into its storage: start it from zero, so the
                    # storage holds this reduction alone, added into .grad below
                    P.shard_grad.zero_()
                elif not adds and aliased:
                    # an earlier micro-batch's reduced shard not yet consumed: move it out of the
                    # plan's storage before this reduce overwrites it (stream-ordered before the pack)
                    P.sharded.grad = P.alias.clone()
            if self._tp is not None:  # TP-replicated parameters' partial gradients, over tp (in torch)
                self._tp.before_reduce(params)
            for P in params:
                P.accumulated = False

    def _after_reduce(self, u, params, micro=None):
        """The reduced shard of `params` into .grad, once the reduction is done (or waited for)."""
        micro = self._micro if micro is None else micro
        if (u, micro) not in self._reduce_views:
            return  # parked in the plan's partial sums until the last micro-step's all-reduce
        with torch.no_grad():
            for P in params:
                if P.sharded.grad is None:
                    P.alias = P.shard_grad
                    P.sharded.grad = P.alias
                elif P.sharded.grad is not P.alias:
                    P.sharded.grad.add_(P.shard_grad)
                # else: the plan added this reduction into .grad's own storage (view_out_add)

    def _finish_backward(self):
        try:
            if self._overlap is not None:
                self._overlap.finish()  # FSDP2's final callback waits for every reduction
            for unit in self.units:
                u = unit["index"]
                if self._post_bwd_done[u] or not unit["params"]:
                    if not unit["params"] and self.live[u]:
                        self._reshard(u, "backward")  # the parameter-less root: nothing to issue
                    continue
                if unit["calls"] > 1 and self._arrived[u] == unit["n_grads"]:
                    self._post_backward(u)  # a call's inputs without a gradient: FSDP2's final callback
                    continue
                if unit["frozen"] and all(P.arrived for P in unit["params"] if P.requires_grad):
                    # frozen parameters and no input with a gradient: FSDP2's final callback runs
                    # its post-backward (where it was gathered in backward or has a gradient)
                    if self.live[u] or unit["n_grads"]:
                        self._post_backward(u)
                    continue
                missing = [P.fqn for P in unit["params"] if P.requires_grad and not P.arrived]
                raise PlanOrderError("commplan: parameter %s of unit %s got no gradient in this backward; the plan "
                                     "reduces every parameter of the unit (use it in the loss, or leave it out of "
                                     "the wrapped modules)" % (missing[0], unit["name"]))
            end = self._micro_end[self._micro]
            if self.check_order and self._pos != end:
                c, u, _ = self._calls[self._pos]
                raise PlanOrderError("commplan: backward ended before %s(%s), which plan %s issues in micro-step %d"
                                     % (c, self.units[u]["name"], self.name, self._micro))
            if self._offloads:
                # CPU offload: the host's sharded grads are complete only when their D2H copies are;
                # FSDP2's finalize_backward waits for them the same way (grad_offload_event, torch
                # 2.15 _fsdp_param_group.py:894-896), before the optimizer steps on the host
                self.lib.synchronize(300.0)
        finally:
            for P in self.params:
                P.arrived = False
            self._reset_pass()
        self._micro += 1
        if self._micro == self._micro_steps:
            self._micro = 0
            self._pos = 0

    # -- the caller's --

    def synchronize(self, timeout_s=300.0):
        """Waits for this rank's communication on the current stream (polling NCCL for errors;
        aborts instead of hanging after timeout_s)."""
        self.lib.synchronize(timeout_s)

    def reset_step(self):
        """After an exception mid-step: waits for the communication in flight, completes the step's
        calls in the plan's order and starts the next forward at a new step (commplan.recovery; made
        by the root's next forward when the previous pass did not finish, as FSDP2 needs nothing)."""
        recovery.reset_step(self)

    def state_dict(self, mesh=None):
        """fully_shard's sharded state dict (DTensors, the model's FQNs): commplan.checkpoint."""
        from .checkpoint import state_dict
        return state_dict(self, mesh)

    def load_state_dict(self, sd, strict=True, mesh=None):
        """Loads fully_shard's form (or full tensors) into the plan's shards: commplan.checkpoint."""
        from .checkpoint import load_state_dict
        return load_state_dict(self, sd, strict, mesh)

    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        """torchtitan's clip_grad_norm_ over the model's sharded gradients: the global norm over the
        plan's shard group (commplan.training), every shard scaled; returns the total norm."""
        return training.clip_grad_norm_([P.sharded for P in self.params], max_norm, norm_type, error_if_nonfinite,
                                        foreach, fsdp=self)

    def close(self):
        if self._head is not None:
            self._head.close()
        training.unregister(self)
        for h in self._handles:
            h.remove()
        self._handles = []
        self.lib.close()
