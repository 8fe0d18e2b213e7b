"""Helpers shared by the test files (test files never import each other)."""
