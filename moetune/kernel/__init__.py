"""moetune's fused-MoE Triton kernel, one op per module (see README "The kernel").

The package's face is three functions, loaded on first use so that importing a
light module of the package (`moetune.kernel.config`, say) never pulls in torch
and triton:

    from moetune.kernel import fused_moe, fused_experts, default_config

`moetune.kernel.fused_moe` is both a module and, as an attribute of this package,
the function of the same name. Import machinery sets a package's attribute to a
submodule when the submodule is first loaded; the package class below keeps the
function there instead, so `from moetune.kernel import fused_moe` always gives the
function while `from moetune.kernel.fused_moe import ...` still reads the module.
"""

from __future__ import annotations

import importlib
import sys
import types

# name -> (module, attribute) of the functions this package exports.
EXPORTS = {
    "fused_moe": ("moetune.kernel.fused_moe", "fused_moe"),
    "fused_experts": ("moetune.kernel.fused_moe", "fused_experts"),
    "default_config": ("moetune.kernel.config", "default_config"),
}
__all__ = list(EXPORTS)


def _export(name: str) -> property:
    module_name, attribute = EXPORTS[name]

    def get(self: types.ModuleType) -> object:
        return getattr(importlib.import_module(module_name), attribute)

    def set_(self: types.ModuleType, value: object) -> None:
        if not isinstance(value, types.ModuleType):  # the submodule itself is ignored
            raise AttributeError(f"moetune.kernel.{name} is read-only")

    return property(get, set_)


class _KernelPackage(types.ModuleType):
    fused_moe = _export("fused_moe")
    fused_experts = _export("fused_experts")
    default_config = _export("default_config")


sys.modules[__name__].__class__ = _KernelPackage
