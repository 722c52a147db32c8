import pytest
import torch

import kiln
from kiln.backends import list_backends, lookup_backend, register_backend
from kiln.testing import assert_same


def test_eager_is_registered():
    assert "eager" in list_backends()
    fn, name = lookup_backend("eager")
    assert name == "eager" and callable(fn)


def test_register_and_use_a_named_backend():
    seen = []

    @register_backend("test_recording")
    def recording(gm, example_inputs):
        seen.append((gm, [tuple(t.shape) for t in example_inputs]))
        return gm.forward

    f = kiln.compile(lambda x, y: x @ y, backend="test_recording")
    x, y = torch.randn(2, 3), torch.randn(3, 4)
    assert_same(f(x, y), x @ y)
    assert seen[0][1] == [(2, 3), (3, 4)]
    placeholders = [n for n in seen[0][0].graph.nodes if n.op == "placeholder"]
    assert [str(n.meta["kiln_source"]) for n in placeholders] == ["L['x']", "L['y']"]


def test_module_parameters_are_static_inputs():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    m = torch.nn.Linear(3, 3)
    kiln.compile(m, backend=backend)(torch.randn(2, 3))
    static = {str(n.meta["kiln_source"]): n.meta["kiln_static"]
              for n in graphs[0].graph.nodes if n.op == "placeholder"}
    assert static == {"L['args'][0]": False,
                      "L['module']._parameters['weight']": True,
                      "L['module']._parameters['bias']": True}


def test_register_rejects_non_callables():
    with pytest.raises(TypeError):
        register_backend("bad", 3)
