"""moetune: tune the fused-MoE Triton kernel for vLLM and SGLang.

Data flows one way: config.json -> mapping -> MoE shape -> search space ->
measurements -> config file. `moetune.extract` does the first three steps
without importing torch or triton; `moetune.kernel` is the Triton kernel;
`moetune.tune` sweeps it.
"""

__version__ = "0.1.0"
