"""Launching runs on multi-node clusters (KubeRay, Slurm)."""
