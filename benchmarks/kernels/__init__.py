"""Kernels only the benchmark's drafter step runs (the plugin never reaches them): the grouped
MoE kernels, the routing and sum kernels, the producers that hand a linear FP8 rows, and
``fp8_linear`` on such rows."""
