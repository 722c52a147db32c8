"""kiln's version (what packages and cache entries record)."""
__version__ = "0.1.0"
