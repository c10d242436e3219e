"""Dagster resources: one per external system (storage, the web, the embedding model, Claude, Kuzu)."""
