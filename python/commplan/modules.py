"""Units from a torch.nn.Module and its fully_shard wrapping, as FSDP2 assigns parameters.

Duck-typed over nn.Module's API (named_parameters, named_children, named_modules): nothing here
imports torch, so the unit tests run it on stand-in modules where torch is absent.
"""

from . import validate
from .errors import PlanError
from .recompute import clean_fqn
from .planfile import dtype_name, plan_from_named_parameters

__all__ = ["Unit", "resolve_units", "units_from_module", "torchtitan_units", "plan_from_module"]


class Unit:
    """One fully_shard call: a module or a list of modules (torchtitan's [norm, output]), an
    optional name (default: the modules' names joined by "_", "root" for the model itself),
    reshard_after_forward (None: the plan's default; the root never reshards after forward; an int k as
    fully_shard takes it, the post-forward groups of k ranks),
    mp_policy: the MixedPrecisionPolicy given to that fully_shard call (None: the plan's fsdp
    dtypes), read duck-typed: its param_dtype and reduce_dtype become the unit's, and its
    param_dtype_override_fn (torch 2.15 _fsdp_api.py:68-110) each parameter's own param_dtype
    (docs/plan-files.md, mixed all-gather dtypes in one unit);
    gradient_divide_factor and force_sum_reduction_for_comms: what the unit's
    FSDPModule.set_gradient_divide_factor / set_force_sum_reduction_for_comms set (None: the plan's);
    grad_accumulation: its own set_requires_gradient_sync / set_requires_all_reduce between
    micro-steps ("sync_last", "all_reduce_last", "fsdp2_default"; None: the plan's);
    ignored_params: the parameters its fully_shard call ignores (kept whole, never communicated);
    offload_policy as fully_shard takes it (None: the plan's default; torch's CPUOffloadPolicy(
    pin_memory=...) or OffloadPolicy(), the plan's unit cpu_offload and pin_memory);
    reshard_after_backward (None: the plan's default; False: FSDPModule.set_reshard_after_backward(False)
    on every micro-step but the last, docs/plan-files.md); unshard_in_backward (None: FSDP2's default;
    False: FSDPModule.set_unshard_in_backward(False), the unit's backward needs no parameter values, as an
    embedding's); forward_prefetch / backward_prefetch: the units
    (Units, their modules, or unit names) FSDPModule.set_modules_to_forward_prefetch /
    set_modules_to_backward_prefetch names for this one."""

    def __init__(self, modules, name=None, reshard_after_forward=None, mp_policy=None, gradient_divide_factor=None,
                 force_sum_reduction_for_comms=None, grad_accumulation=None, ignored_params=None,
                 offload_policy=None, reshard_after_backward=None, forward_prefetch=None, backward_prefetch=None,
                 unshard_in_backward=None):
        self.modules = list(modules) if isinstance(modules, (list, tuple)) else [modules]
        if not self.modules:
            raise PlanError("a unit needs at least one module")
        if name is not None and not isinstance(name, str):
            raise PlanError("Unit: name: expected a str or None, got %s" % validate.describe(name, False))
        # (an int: fully_shard(reshard_after_forward=k), the post-forward group size)
        reshard_after_forward = validate.check_raf_or_none(reshard_after_forward, "reshard_after_forward", src="Unit")
        validate.check_bool_or_none(reshard_after_backward, "reshard_after_backward", src="Unit")
        validate.check_bool_or_none(unshard_in_backward, "unshard_in_backward", src="Unit")
        self.name = name
        self.reshard_after_forward = reshard_after_forward
        self.mp_policy = mp_policy
        self.gradient_divide_factor = gradient_divide_factor
        self.force_sum_reduction_for_comms = force_sum_reduction_for_comms
        self.grad_accumulation = grad_accumulation  # the unit's own set_requires_gradient_sync / _all_reduce
        # fully_shard(..., ignored_params=): parameter objects of its modules left whole and uncommunicated
        self.ignored_params = list(ignored_params or [])
        self.cpu_offload, self.pin_memory = _offload_of(offload_policy)
        self.reshard_after_backward = reshard_after_backward
        self.unshard_in_backward = unshard_in_backward  # FSDPModule.set_unshard_in_backward
        self.forward_prefetch = None if forward_prefetch is None else list(forward_prefetch)
        self.backward_prefetch = None if backward_prefetch is None else list(backward_prefetch)

    def __repr__(self):
        return "Unit(%r, reshard_after_forward=%r)" % (self.name, self.reshard_after_forward)


def _offload_of(policy):
    """(cpu_offload, pin_memory) of a fully_shard offload_policy: torch 2.15 _fsdp_api.py:231-255
    (OffloadPolicy: none; CPUOffloadPolicy(pin_memory=True))."""
    if policy is None:
        return None, None
    kind = type(policy).__name__
    if kind == "CPUOffloadPolicy":
        return True, bool(policy.pin_memory)
    if kind == "OffloadPolicy":
        return False, None
    raise PlanError("Unit: offload_policy: expected torch's CPUOffloadPolicy or OffloadPolicy (fully_shard's "
                    "offload_policy), got %s" % validate.describe(policy, False))


def _module_names(model):
    # the model's FQNs: without activation checkpointing's wrapper segment (commplan.recompute)
    return {id(m): clean_fqn(n) for n, m in model.named_modules()}


def _param_names(model):
    names = {}
    for n, p in model.named_parameters():  # dedups shared parameters: the first name wins, as in FSDP2
        names.setdefault(id(p), clean_fqn(n))
    return names


def resolve_units(model, units):
    """units (modules, lists of modules, Unit objects) -> Units in wrapping order with the root
    (model itself) last, names filled in. The root is appended when the list does not end with it."""
    if isinstance(units, (str, bytes, dict)) or not hasattr(units, "__iter__"):
        raise PlanError("units: expected a list of modules, lists of modules or Units in fully_shard order, got %s"
                        % validate.describe(units, False))
    out = [u if isinstance(u, Unit) else Unit(u) for u in units]
    if not out or out[-1].modules != [model]:
        out.append(Unit(model))
    mod_names = _module_names(model)
    for u in out[:-1]:
        if any(m is model for m in u.modules):
            raise PlanError("the model itself must be the last unit (the root), not a unit in the middle")
    for u in out:
        for m in u.modules:
            if id(m) not in mod_names:
                raise PlanError("unit %s holds a module that is not a submodule of the model" % (u.name or "?"))
        if u.name is None:
            if u.modules == [model]:
                u.name = "root"
            else:
                u.name = "_".join(mod_names[id(m)] or "root" for m in u.modules)
    return out


def _own_params(module):
    """A module's directly registered parameters, in registration order."""
    try:
        return list(module.named_parameters(recurse=False))
    except TypeError:  # a stand-in without the keyword
        return list(getattr(module, "_parameters", {}).items())


def units_from_module(model, units, shard_dim=None):
    """[(unit, [(fqn, param), ...])] for resolved units: FSDP2's assignment -- each fully_shard call
    manages the parameters of its modules' subtrees (pre-order, registration order) except the
    subtrees that an earlier call already wrapped."""
    units = resolve_units(model, units)
    names = _param_names(model)
    wrapped = set()
    owner = {}
    result = []
    for u in units:
        roots = {id(m) for m in u.modules}
        managed = []
        seen_mod = set()
        for root in u.modules:
            stack = [root]
            while stack:
                m = stack.pop()
                if id(m) in seen_mod:
                    continue
                seen_mod.add(id(m))
                if id(m) in wrapped and id(m) not in roots:
                    continue
                managed.append(m)
                kids = [c for _, c in m.named_children()]
                stack.extend(reversed(kids))
        params = []
        seen = set()
        for m in managed:
            for _, p in _own_params(m):
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                fqn = names[id(p)]
                if id(p) in owner:
                    raise PlanError("parameter %s is in unit %s and unit %s (a shared parameter): wrap the modules "
                                    "that share it in one unit" % (fqn, owner[id(p)], u.name))
                owner[id(p)] = u.name
                params.append((fqn, p))
        wrapped |= roots
        result.append((u, params))
    return result


def _shard_dim_of(shard_dim, fqn, p):
    if shard_dim is None:
        return 0
    if callable(shard_dim):
        d = shard_dim(fqn, p)
    elif isinstance(shard_dim, dict):
        d = shard_dim.get(fqn, 0)
    else:
        raise PlanError("shard_dim: expected a dict fqn -> dim or a callable (fqn, param) -> dim, got %s"
                        % validate.describe(shard_dim, False))
    if not isinstance(d, int):
        if isinstance(getattr(d, "dim", None), int):  # a Shard(k) placement, as shard_placement_fn returns
            d = d.dim
        elif hasattr(d, "__index__") and not isinstance(d, bool):  # numpy / one-element torch integers
            try:
                d = d.__index__()
            except (TypeError, ValueError):
                pass
    return validate.check_value(d, validate.Spec("int", lo=0), "shard_dim", fqn)


def named_units(model, units, shard_dim=None):
    """The plan writer's units: [{name, params: [(fqn, shape, dtype, shard_dim)], reshard_after_forward}]."""
    out = []
    for u, params in units_from_module(model, units):
        ign = {id(p) for p in getattr(u, "ignored_params", [])}
        # a parameter with requires_grad=False (torchtitan's LoRA converter freezes the base
        # weights): frozen, all-gathered and never reduced (docs/plan-files.md)
        ps = [{"name": fqn, "shape": tuple(int(d) for d in p.shape), "dtype": dtype_name(p.dtype, fqn),
               "ignored": True} if id(p) in ign else
              {"name": fqn, "shape": tuple(int(d) for d in p.shape), "dtype": dtype_name(p.dtype, fqn),
               "shard_dim": _shard_dim_of(shard_dim, fqn, p), "frozen": True}
              if getattr(p, "requires_grad", True) is False else
              (fqn, tuple(int(d) for d in p.shape), dtype_name(p.dtype, fqn), _shard_dim_of(shard_dim, fqn, p))
              for fqn, p in params]
        entry = {"name": u.name, "params": ps, "reshard_after_forward": u.reshard_after_forward}
        mp = getattr(u, "mp_policy", None)
        if mp is not None:
            _mp_of(entry, mp, params)
        for k in ("gradient_divide_factor", "force_sum_reduction_for_comms", "grad_accumulation"):
            if getattr(u, k, None) is not None:
                entry[k] = getattr(u, k)
        if getattr(u, "cpu_offload", None) is not None:  # the unit's own offload_policy
            entry["cpu_offload"] = u.cpu_offload
            if u.cpu_offload:
                entry["pin_memory"] = u.pin_memory
        if getattr(u, "reshard_after_backward", None) is not None:
            entry["reshard_after_backward"] = u.reshard_after_backward
        if getattr(u, "unshard_in_backward", None) is not None:
            entry["unshard_in_backward"] = u.unshard_in_backward
        out.append(entry)
    resolved = resolve_units(model, units)
    for u, entry in zip(resolved, out):
        for k in ("forward_prefetch", "backward_prefetch"):
            targets = getattr(u, k, None)
            if targets is not None:
                entry[k] = [_unit_name_of(t, resolved, u.name, k) for t in targets]
    return out


def _unit_name_of(t, units, owner, key):
    """A prefetch target (a Unit, its module or list of modules, or a unit name) -> the unit's name."""
    if isinstance(t, str):
        return t
    for v in units:
        if t is v or v.modules == (t if isinstance(t, list) else [t]) or (not isinstance(t, list) and
                                                                          len(v.modules) == 1 and v.modules[0] is t):
            return v.name
    raise PlanError("unit %s: %s names %s, which is not one of the units" % (owner, key, validate.describe(t, False)))


def _mp_of(entry, mp, params):
    """A unit's MixedPrecisionPolicy into its writer entry: param_dtype / reduce_dtype, and each
    parameter's param_dtype_override_fn result (None: the unit's, as FSDP2 reads it); an ignored
    parameter's entry (a dict) as it is, the function not called on it."""
    for key in ("param_dtype", "reduce_dtype"):
        v = getattr(mp, key, None)
        if v is not None:
            entry[key] = dtype_name(v, "%s's mp_policy.%s" % (entry["name"], key))
    fn = getattr(mp, "param_dtype_override_fn", None)
    if fn is None:
        return
    ps = []
    for e, (_, p) in zip(entry["params"], params):
        if isinstance(e, dict) and e.get("ignored"):  # an ignored parameter: FSDP2 never casts it
            ps.append(e)
            continue
        if isinstance(e, dict):  # a frozen one: all-gathered, cast as the others
            q = dict(e)
        else:
            fqn, shape, dt, sd = e
            q = {"name": fqn, "shape": shape, "dtype": dt, "shard_dim": sd}
        got = fn(p)
        if got is not None:
            q["param_dtype"] = dtype_name(got, "%s: mp_policy.param_dtype_override_fn" % q["name"])
        ps.append(q)
    entry["params"] = ps


def torchtitan_units(model):
    """torchtitan's apply_fsdp wrapping of its Llama: tok_embeddings, every block of model.layers,
    [norm, output] without reshard after forward, and the root. With tied embeddings (output's
    weight is tok_embeddings'), [tok_embeddings, norm, output] is one unit kept unsharded through
    forward (the parameter is used at both ends)."""
    layers = model.layers
    blocks = list(layers.values()) if hasattr(layers, "values") else list(layers)
    tied = getattr(getattr(model, "output", None), "weight", None) is not None and \
        model.output.weight is getattr(model.tok_embeddings, "weight", None)
    if tied:
        return [Unit([model.tok_embeddings, model.norm, model.output], reshard_after_forward=False)] + \
            [Unit(b) for b in blocks] + [Unit(model)]
    return [Unit(model.tok_embeddings)] + [Unit(b) for b in blocks] + \
        [Unit([model.norm, model.output], reshard_after_forward=False), Unit(model)]


def plan_from_module(model, units, name, world_size, parallel=None, fsdp=None, model_numbers=None,
                     topology=None, training=None, family="auto", shard_dim=None, out=None):
    """The plan file (Lua text) for model under the given fully_shard wrapping.

    units: in the order fully_shard is called (inner first), each a module, a list of modules (one
    call), or Unit(modules, name=, reshard_after_forward=); the model itself last (appended if left
    out). torchtitan_units(model) gives torchtitan's. model_numbers: n_heads, seq_len, ... as for
    plan_from_named_parameters. shard_dim: a dict fqn -> dim or a callable (fqn, param) -> dim
    (FSDP2's shard_placement_fn), default 0."""
    return plan_from_named_parameters(name, named_units(model, units, shard_dim), world_size, parallel=parallel,
                                      fsdp=fsdp, model=model_numbers, topology=topology, training=training,
                                      family=family, out=out)
