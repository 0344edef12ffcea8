"""commplan's Python package: plan files from PyTorch models, and a generated plan's library
driving a model's FSDP2 communication.

Writing plans needs only the standard library (no torch import):

    plan_from_named_parameters  units as lists of (name, shape, dtype[, shard_dim])
    plan_from_module            a torch.nn.Module and its fully_shard wrapping (torchtitan_units)
    hf_config                   a Hugging Face config.json (Llama, Mistral, Qwen2; Mixtral, Qwen3-MoE,
                                DeepSeek-V3) as a model table
    plan_from_titan             torchtitan 0.3's own Llama (module, config or ModelSpec), as it parallelizes it
    plan_text / write_plan      any model table (llama, an MoE family or generic) as plan file text / a file
    check_units_match_plan      a model's units against a generated plan.json, first difference

From the shell: the ``commplan`` command (``pip install ./python``; ``python3 -m commplan`` is
the same): ``commplan write CONFIG.json --name NAME --world-size N [--tp T ...] -o PLAN.lua``, then
``generate``, ``audit``, ``diff``, ``advise``, ``check`` (commplan/cli.py, command.py;
docs/your-repository.md), and ``hf`` / ``units`` with an ``--options`` JSON.

Every input is checked for type and shape in one place (commplan/validate.py: config.json, the
writer's options, plan.json), every file read and written through one module (commplan/safeio.py:
regular files only, bounded; writes through an exclusive temporary file and a rename, never
through a symlink); every refusal is one PlanError line naming the file or option and the field.

Running a plan (torch 2.x, CUDA, a plan built with nvcc): ``from commplan.runtime import
CommplanFSDP`` (commplan.runtime imports torch; nothing else here does).
"""

from .errors import OutputError
from .planfile import (PlanError, c_ident, check_names, check_plan_name, dtype_name, ffn_hidden, lua_string,
                       normalize_units, plan_from_named_parameters, plan_text, write_plan)
from .modules import Unit, named_units, plan_from_module, resolve_units, torchtitan_units, units_from_module
from .hf import hf_config
from .titan import plan_from_titan
from .match import PlanMismatch, check_units_match_plan, find_plan_json, load_plan_json, plan_units
from .validate import executed_plan

__version__ = "0.1.0"

__all__ = [
    "PlanError", "OutputError", "PlanMismatch", "Unit",
    "c_ident", "check_names", "check_plan_name", "dtype_name", "ffn_hidden", "lua_string", "normalize_units",
    "plan_from_named_parameters", "plan_text", "write_plan",
    "named_units", "plan_from_module", "resolve_units", "torchtitan_units", "units_from_module",
    "hf_config", "plan_from_titan",
    "check_units_match_plan", "find_plan_json", "load_plan_json", "plan_units", "executed_plan",
]
