"""bench/ uses the tuner only through its public API, `moetune.tune.api`, so tune/ can change.

The two probes of the timing harness itself (bench/ceilings.py measures each ceiling
`moetune.tune.measure.ceilings` takes the best of; bench/decode_stability.py subclasses
the harness's whole-call bench) import the harness module they probe, and nothing else
of tune/.
"""

import ast
from pathlib import Path

import moetune.tune.api as api

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Script -> the one tune/ module it may import besides the API (the harness it probes).
HARNESS_PROBES = {
    "ceilings.py": "moetune.tune.measure",
    "decode_stability.py": "moetune.tune.measure",
}


def tune_imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of every import of moetune.tune or below in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module = node.module
            names = tuple(alias.name for alias in node.names)
            if module == "moetune" and "tune" in names:
                found.append(("moetune.tune", names))
            elif module == "moetune.tune" or module.startswith("moetune.tune."):
                found.append((module, names))
        elif isinstance(node, ast.Import):
            found += [
                (alias.name, ())
                for alias in node.names
                if alias.name == "moetune.tune" or alias.name.startswith("moetune.tune.")
            ]
    return found


def test_bench_imports_the_tuner_through_its_api_only():
    scripts = sorted(BENCH.glob("*.py"))
    assert len(scripts) > 10  # the folder is where this test thinks
    wrong = [
        f"{path.name}: from {module} import {', '.join(names)}"
        for path in scripts
        for module, names in tune_imports(path)
        if module != "moetune.tune.api" and module != HARNESS_PROBES.get(path.name)
    ]
    assert wrong == []


def test_bench_uses_only_names_the_api_declares():
    used = {
        name
        for path in BENCH.glob("*.py")
        for module, names in tune_imports(path)
        if module == "moetune.tune.api"
        for name in names
    }
    assert used, "no bench script imports the API: the test reads the wrong folder"
    assert sorted(used - set(api.__all__)) == []
    assert all(hasattr(api, name) for name in api.__all__)


def test_the_check_finds_an_internal_import(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import moetune.tune.store\n"
        "from moetune.tune.sweep import plan_sweep\n"
        "from moetune.tune import runner\n"
        "from moetune.tune.api import plan\n"
        "def f():\n    from moetune.tune.runner import run_tune\n"
    )
    assert sorted(module for module, _ in tune_imports(script)) == [
        "moetune.tune",
        "moetune.tune.api",
        "moetune.tune.runner",
        "moetune.tune.store",
        "moetune.tune.sweep",
    ]
