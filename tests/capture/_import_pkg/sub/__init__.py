from .. import VALUE as PARENT_VALUE  # noqa: F401
