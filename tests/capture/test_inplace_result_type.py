"""An in-place arithmetic op whose result type cannot be cast to the tensor's own dtype
(``int_tensor.mul_(2.5)``) raises eager's RuntimeError. Fake tensors let it pass and the
functionalized graph (``mul`` then ``copy_``) cast silently: aot_eager returned a result."""
import pytest
import torch

import kiln

SETTINGS = [("eager", None), ("aot_eager", None), ("aot_eager", True)]


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
@pytest.mark.parametrize("op", [lambda i, x: i.mul_(2.5), lambda i, x: i.add_(x), lambda i, x: i.div_(2),
                                lambda i, x: (i > 0).sub_(0.5)], ids=["mul_float", "add_float_tensor",
                                                                      "div_int", "bool_sub_float"])
def test_uncastable_inplace_raises_like_eager(op, backend, dynamic):
    def f(x):
        i = x.long()
        op(i, x)
        return i

    x = torch.randn(3)
    with pytest.raises(RuntimeError) as eager:
        f(x)
    with pytest.raises(RuntimeError) as compiled:
        kiln.compile(f, backend=backend, dynamic=dynamic)(x)
    assert str(compiled.value) == str(eager.value)


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_castable_inplace_ops_stay_in_the_graph(backend, dynamic):
    def f(x):
        i = x.long()
        i.mul_(2)
        i.add_(torch.tensor(3))
        y = x.clone()
        y.mul_(i)
        y.add_(True)
        h = x.half()
        h.add_(x)
        return i, y, h

    x = torch.randn(3)
    for a, b in zip(kiln.compile(f, backend=backend, dynamic=dynamic)(x), f(x)):
        torch.testing.assert_close(a, b)
