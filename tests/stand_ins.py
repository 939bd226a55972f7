"""Stand-ins for the engines' released files, shared by the tests that need an engine
"installed" without its wheel (tests/ is on sys.path: ``from stand_ins import ...``).

The released engines themselves are tested in tests/engines_real (``make test-engines``).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace


def stand_in_release(module: ModuleType, gained: str | None = None) -> str:
    """A kernel file with the interface release `module` declares (its launcher reading
    the declared config keys); `gained`: one more positional parameter after the first.
    Nothing in it runs: the interface check reads the file."""
    interface = module.INTERFACE
    parameters = [p.replace(": constexpr", ": tl.constexpr") for p in interface.parameters]
    if gained:
        parameters.insert(1, gained)
    reads = "".join(f"    config.get({key!r})\n" for key in sorted(interface.config_keys))
    return (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        f"def {interface.kernel}({', '.join(parameters)}):\n    pass\n\n\n"
        f"def {interface.launcher}(config):\n{reads}"
    )


def stand_in_vllm(site: Path, kernel_text: str | None = None) -> Path:
    """vLLM 0.33.0 as `find_installed` sees a ``pip install --no-deps`` of it, in `site`;
    its kernel file holds `kernel_text` (default: 0.33.0's interface, `stand_in_release`).
    Returns the kernel file."""
    from moetune.engines.launch import vllm_0_33

    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise ImportError('never imported')\n")
    dist = site / "vllm-0.33.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    fused_moe = site / "vllm" / "model_executor" / "layers" / "fused_moe"
    fused_moe.mkdir(parents=True)
    kernel = fused_moe / "fused_moe.py"
    kernel.write_text(stand_in_release(vllm_0_33) if kernel_text is None else kernel_text)
    (fused_moe / "configs").mkdir()
    return kernel


class KernelRecorder:
    """Stands for a jit kernel: each ``kernel[grid](*args, **kwargs)`` is written down in
    `launches` (a callable grid evaluated on the keywords, as Triton evaluates it); `grid`,
    `args` and `kwargs` are the last launch's."""

    def __init__(self) -> None:
        self.launches: list[SimpleNamespace] = []

    def __getitem__(self, grid):  # noqa: ANN001, ANN204
        def launch(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            shown = grid(kwargs) if callable(grid) else grid
            self.launches.append(SimpleNamespace(grid=tuple(shown), args=args, kwargs=kwargs))

        return launch

    @property
    def grid(self) -> tuple:
        return self.launches[-1].grid

    @property
    def args(self) -> tuple:
        return self.launches[-1].args

    @property
    def kwargs(self) -> dict:
        return self.launches[-1].kwargs
