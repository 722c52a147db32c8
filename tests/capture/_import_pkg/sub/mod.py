def relative_imports(x):
    from . import helper
    from .helper import twice
    from .. import VALUE
    from ..sub import PARENT_VALUE
    return twice(x) * VALUE + helper.K + PARENT_VALUE


def missing_relative_name(x):
    from .helper import nothing_here  # noqa: F401
    return x


def lazy_import(x):
    y = x * 2
    from . import lazy
    return y + lazy.OFFSET
