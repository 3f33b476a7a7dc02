"""Console progress and the metrics file."""
