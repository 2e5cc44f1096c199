"""Lab-only shim: let vLLM's CPU platform use the Ray executor.

The CPU build refuses `--distributed-executor-backend ray` because its platform
declares no Ray device key. The lab starts every Ray node with `--num-gpus=1`,
so mapping the CPU platform onto Ray's "GPU" resource lets placement groups
place one tensor-parallel rank per lab node, exactly as on real GPU hosts.
Real deployments never carry this file.
"""

try:
    from vllm.platforms import cpu as _cpu_platform

    _cpu_platform.CpuPlatform.ray_device_key = "GPU"
except Exception:  # vLLM absent or reorganised: leave the interpreter untouched
    pass
