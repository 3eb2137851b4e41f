"""State: the home folder, DuckDB, MLflow tracking, row conversions."""
