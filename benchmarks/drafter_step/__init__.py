"""The drafter-step benchmark's parts: the step model, its variants, timing, the sweep, the report."""
