"""Tests of the command line surface: help screens, usage errors, rendering."""
