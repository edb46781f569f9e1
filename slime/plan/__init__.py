"""Planning a run before anything starts: resolve(cfg) once -> a read-only config plus a RunPlan (derived values,
engine specs, each role's bundles, rank layout, memory estimate); the dry run prints the plan, the driver executes
it. Validation (validate.py) walks every check; derive.py computes the derived values. No Ray, no torch."""
