"""Dagster wiring: Definitions, jobs, sensors and schedules of the pack build."""
