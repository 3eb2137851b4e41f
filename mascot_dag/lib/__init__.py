"""Pure logic of MASCOT-DAG: nothing in this package imports dagster."""
