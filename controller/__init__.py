"""Opus controller: pure scheduling core, OCS driver interface, service and shim."""
