"""kiln/names.py: objects by name, and the functions a name reaches through decorators."""
import functools

import pytest

from kiln.names import functions_under, resolve_name


def _plain(x):
    return x


@functools.wraps(_plain)
def _wrapped(*a):
    return _plain(*a)


def _keeps(fn):
    def keeper(*a):
        return fn(*a)
    return keeper


class _C:
    @property
    def p(self):
        return 1


def test_resolve_name_finds_nested_attributes_and_raises_for_missing_ones():
    assert resolve_name("functools", "partial") is functools.partial
    assert resolve_name(__name__, "_C.p") is _C.__dict__["p"]
    with pytest.raises(AttributeError):
        resolve_name("functools", "no_such_thing")


@pytest.mark.parametrize("outer, inner", [(_wrapped, _plain), (_keeps(_plain), _plain), (_C.__dict__["p"], None)])
def test_functions_under_a_name_include_what_decorators_wrap(outer, inner):
    found = functions_under(outer)
    assert found[0] is (outer.fget if isinstance(outer, property) else outer)
    if inner is not None:
        assert inner in found
