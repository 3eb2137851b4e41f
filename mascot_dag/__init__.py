"""MASCOT-DAG."""
