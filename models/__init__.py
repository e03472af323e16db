"""Model builders (being written)."""
