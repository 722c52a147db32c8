"""Imported only by the compiled code under test (the import is a graph break)."""
OFFSET = 7
