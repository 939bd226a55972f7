"""The package's face: functions, not modules, and no torch until one is used."""

import subprocess
import sys


def run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_exports_are_the_functions_whatever_was_imported_before():
    out = run(
        "import moetune.kernel.fused_moe\n"
        "from moetune.kernel.fused_moe import fused_moe as direct\n"
        "from moetune.kernel import fused_moe, fused_experts, default_config\n"
        "import types\n"
        "print(fused_moe is direct, callable(fused_experts), callable(default_config),\n"
        "      isinstance(fused_moe, types.ModuleType))"
    )
    assert out == "True True True False"


def test_function_first_then_module_import_still_works():
    out = run(
        "from moetune.kernel import fused_moe\n"
        "from moetune.kernel.fused_moe import fused_experts\n"
        "import moetune.kernel.fused_moe, sys\n"
        "from moetune.kernel import fused_moe as again\n"
        "print(fused_moe is again, sys.modules['moetune.kernel.fused_moe'].fused_experts is fused_experts)"
    )
    assert out == "True True"


def test_importing_the_package_or_its_config_loads_no_torch():
    out = run(
        "import sys, moetune.kernel, moetune.kernel.config\n"
        "print('torch' in sys.modules, 'triton' in sys.modules)"
    )
    assert out == "False False"
