"""The engines' own Triton kernels, loaded from the released files (the lead's kernel tests).

`InstalledEngine.kernel_source` (fixtures `vllm_installed`, `sglang_installed` in
conftest.py) is the file holding each release's ``fused_moe_kernel``; tests here
load it without importing the engine and check moetune's launch against it.
Mark them `pytest.mark.engines`; scripts/fetch_engines.py's MEMBERS lists the
files fetched (add what the kernels import).
"""
