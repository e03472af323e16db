"""Datasets (being written)."""
