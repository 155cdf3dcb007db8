"""Unit tests of the pure modules (no root, no network)."""
