"""Tests of the GCP adapter against recorded Compute Engine responses."""
