"""Maintainer tools that are not part of the simulator (run from the repository root)."""
