"""A package for tests/capture/test_python_semantics.py: relative imports inside compiled code."""
VALUE = 10
