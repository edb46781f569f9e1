"""Planning a run before anything starts: validation (validate.py walks every check), the derived values."""
