"""Running the lineage: cluster requests, local servers, console noise."""
