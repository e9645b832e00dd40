"""Tools of the project's own: gpu_check (./kit gpu-check) and cpu_profile (./kit test --cpu)."""
