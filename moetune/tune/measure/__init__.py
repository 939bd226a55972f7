"""Timing configs on the GPU: worker processes (compile on CPU, time on the GPU), the one
CUDA-graph harness, reference checks, device ceilings, routing and signal handling."""
