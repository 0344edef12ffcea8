"""Does a model (its fully_shard units and named parameters) match a generated plan?

Pure Python over plan.json (docs/plan-json.md) and the units the plan writer takes, so it runs
and is tested without torch. A mismatch is one line naming the first difference.
"""

import os

from . import safeio
from .errors import PlanError
from .planfile import normalize_units
from .validate import check_plan_json, describe

__all__ = ["PlanMismatch", "load_plan_json", "find_plan_json", "find_plan_root", "checkout_root", "plan_units", "check_units_match_plan"]


class PlanMismatch(PlanError):
    """The model's parameters differ from the plan's (name, shape, dtype, order or units)."""


def checkout_root():
    """The commplan checkout holding this package (python/commplan/ under it, gen/commplan.lua
    beside), or None where the package is installed elsewhere."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return here if os.path.isfile(os.path.join(here, "gen", "commplan.lua")) else None


def _candidates(name, root):
    return [os.path.join(root, "plans", name, "plan.json"), os.path.join(root, "build", name, "gen", "plan.json")]


def find_plan_root(name, root=None):
    """(root, path of plan.json) for plan `name`: plans/<name>/plan.json (a committed plan), else
    build/<name>/gen/plan.json (make PLAN=path), under `root`. root=None: under the working
    directory and under the commplan checkout this package comes from (checkout_root); used
    where exactly one of them has it (or both are the same file), refused where they hold
    different ones (pass root=)."""
    roots = [root] if root is not None else list(dict.fromkeys(
        r for r in (os.getcwd(), checkout_root()) if r is not None))
    searched, found = [], []
    for r in roots:
        for path in _candidates(name, r):
            searched.append(path)
            if os.path.isfile(path):
                if not any(os.path.samefile(path, p) for _, p in found):
                    found.append((r, path))
                break
    if len(found) == 1:
        return found[0]
    if found:
        raise PlanError("plan %s is under both %s and %s; pass root= (the commplan checkout whose plans/ and build/ "
                        "hold it) to choose" % (name, found[0][1], found[1][1]))
    raise PlanError("no plan.json for plan %s (searched %s): pass root= (the commplan checkout whose plans/ and "
                    "build/ hold it), or generate it there with make PLAN=%s.lua" % (name, ", ".join(searched), name))


def find_plan_json(name, root=None):
    """The path of plan `name`'s plan.json, as find_plan_root finds it."""
    return find_plan_root(name, root)[1]


def load_plan_json(path_or_dict):
    """A generated plan.json (a path, or the parsed dict) with the fields read here and by the
    runtime checked for type: a regular file, bounded, strict JSON (safeio). A repeated
    micro-step (plan.json's "repeat") comes back expanded: "ops" are the ops as the executor
    issues them (executed_plan)."""
    if isinstance(path_or_dict, (dict, list)):
        return check_plan_json(path_or_dict, "plan.json")
    if not isinstance(path_or_dict, (str, bytes, os.PathLike)):
        raise PlanError("plan.json: expected its path or the parsed dict, got %s" % describe(path_or_dict, False))
    plan, src = safeio.read_json(path_or_dict, "plan.json", safeio.PLAN_JSON_MAX)
    return check_plan_json(plan, src)


def plan_units(plan):
    """The plan's units in its table order (the root first, then wrapping order), each
    {name, index, reshard_after_forward, params: [{name, shape, dtype, shard_dim, ...}]}."""
    units = sorted(plan["units"], key=lambda u: u["index"])
    if [u["index"] for u in units] != list(range(len(units))):
        raise PlanError("plan.json's unit indices are not 0..%d; regenerate the plan" % (len(units) - 1))
    return units


def _fmt(p):
    shard = "" if not p.get("shard_dim") else " shard_dim %d" % p["shard_dim"]
    return "%s %s %s%s" % (p["name"], "(" + ", ".join(str(d) for d in p["shape"]) + ")", p["dtype"], shard)


def check_units_match_plan(units, plan):
    """Raises PlanMismatch naming the first difference between the model's units (wrapping order,
    the root last; as plan_from_named_parameters takes them) and the plan (plan.json's dict or
    path). Compares unit order and names, then each parameter's name, shape, dtype and shard dim
    in order, then the units' reshard_after_forward where the model sets it. Under tensor
    parallelism (parallel.tp > 1) the shapes are TP-local: the model's as its TP left them,
    plan.json's `shape` (its `full_shape` is the global one; commplan.tensor_parallel checks the TP
    dims)."""
    plan = load_plan_json(plan)
    name = plan.get("plan", "?")
    model_units = normalize_units(units)
    model_units = [model_units[-1]] + model_units[:-1]  # table order: the root runs first
    punits = plan_units(plan)
    if len(model_units) != len(punits):
        raise PlanMismatch("model does not match plan %s: the model has %d units (%s), the plan %d (%s)"
                           % (name, len(model_units), ", ".join(u["name"] for u in model_units), len(punits),
                              ", ".join(u["name"] for u in punits)))
    for i in range(min(len(model_units), len(punits))):
        mu, pu = model_units[i], punits[i]
        if mu["name"] != pu["name"]:
            raise PlanMismatch("model does not match plan %s: unit %d (in forward order, the root first) is %s "
                               "in the model and %s in the plan" % (name, i, mu["name"], pu["name"]))
    for mu, pu in zip(model_units, punits):
        mps, pps = mu["params"], pu["params"]
        for j in range(min(len(mps), len(pps))):
            mp, pp = mps[j], pps[j]
            if (mp["name"], list(mp["shape"]), mp["dtype"], mp.get("shard_dim", 0)) != \
                    (pp["name"], list(pp["shape"]), pp["dtype"], pp.get("shard_dim", 0)):
                raise PlanMismatch("model does not match plan %s: unit %s parameter %d: the model has %s, the "
                                   "plan %s" % (name, mu["name"], j, _fmt(mp), _fmt(pp)))
            # requires_grad=False is the plan's frozen (gathered, never reduced: docs/plan-files.md)
            if bool(mp.get("frozen")) != bool(pp.get("frozen")):
                raise PlanMismatch("model does not match plan %s: unit %s parameter %s has requires_grad=%s in the "
                                   "model but is %s in the plan; regenerate the plan from the model (commplan write "
                                   "reads requires_grad)" % (name, mu["name"], mp["name"], not mp.get("frozen"),
                                                            "frozen" if pp.get("frozen") else "trainable"))
        if len(mps) != len(pps):
            who, p = ("model", mps[len(pps)]) if len(mps) > len(pps) else ("plan", pps[len(mps)])
            raise PlanMismatch("model does not match plan %s: unit %s has %d parameters in the model and %d in the "
                               "plan; the %s's parameter %d is %s" % (name, mu["name"], len(mps), len(pps), who,
                                                                    min(len(mps), len(pps)), _fmt(p)))
    par = plan.get("parallel") or {}
    shard = int(par.get("dp_shard", 1)) * int(par.get("cp", 1))
    for i, (mu, pu) in enumerate(zip(model_units, punits)):
        raf = mu["reshard_after_forward"]
        # an int k (fully_shard(reshard_after_forward=k)): 1 is False and the shard group's size True
        # (torch 2.15 _fsdp_init.py:174-182), any other k the plan's post_forward
        want = pu.get("post_forward") or bool(pu["reshard_after_forward"])
        have = raf if isinstance(raf, bool) or raf is None else (False if raf == 1 else True if raf == shard else raf)
        if i > 0 and raf is not None and not (type(have) is type(want) and have == want):
            raise PlanMismatch("model does not match plan %s: unit %s has reshard_after_forward=%s in the model "
                               "and %s in the plan" % (name, mu["name"], raf, want))
