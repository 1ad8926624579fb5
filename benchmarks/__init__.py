"""Benchmarks of mtpconv and the sweeps that write its tuning tables (not shipped).

Run from the repository root as ``python -m benchmarks.<program> --help``; docs/BENCHMARKS.md
gives each current figure with its command.
"""
