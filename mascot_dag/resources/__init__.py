"""Dagster resources: configuration-only wrappers around mascot_dag.lib."""
