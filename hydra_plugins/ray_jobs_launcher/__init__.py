"""Hydra launcher `hydra/launcher=ray_jobs`: each job of a multirun is a Ray Job (see ray_jobs_launcher.py)."""
