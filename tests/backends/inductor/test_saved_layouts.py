"""A backward reads its saved tensors with the layouts its own forward returned them in, also
when it is compiled later than other forwards of the same captured graph (a chain of parts, a
compile per shape) and when it is a partial backward made at run time (a Falcon-H1 training
step crashed in Inductor's size/stride assert on a saved split-and-transposed value)."""
import copy

import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln
from kiln.aot import partial
from kiln.backends.inductor.backend import GraphCompile


def _backward(num_saved: int = 1) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    saved = g.placeholder("saved")
    tangent = g.placeholder("tangents_1")
    tangent.meta["kiln_tangent"] = True
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (saved, tangent)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    gm.meta.update(kiln_num_saved=num_saved, kiln_partition=7, kiln_donated=[0])
    return gm


def test_a_partial_backward_keeps_what_the_backend_knows_of_its_backward():
    bw = _backward()
    with FakeTensorMode():
        for p in bw.graph.nodes:
            if p.op == "placeholder":
                p.meta["val"] = torch.empty(4, 4)
    got = partial.without_tangents(bw, 1, frozenset({0}))
    assert got.meta["kiln_num_saved"] == 1 and got.meta["kiln_partition"] == 7
    assert got.meta["kiln_donated"] == []       # (it may run again, for other outputs)


def test_the_backward_takes_the_strides_of_its_own_forward():
    compile_ = GraphCompile({}, _backward())
    # its forward returned the saved value transposed; a later forward (another part) compact
    compile_._fw_layouts[7] = ([None, (1, 4)], 1)
    compile_._fw_output_strides, compile_._fw_num_outputs = [None, (4, 1)], 1
    with FakeTensorMode() as mode:
        example = [torch.empty(4, 4), torch.empty(4, 4)]
    out = compile_._restride_saved(_backward(), example, mode)
    assert out[0].stride() == (1, 4)
    assert out[1] is example[1]                 # (a tangent: as given)
    # a backward of no known partition (loaded from the cache): the graph's last forward
    other = _backward()
    del other.meta["kiln_partition"]
    assert compile_._restride_saved(other, example, mode)[0].stride() == (4, 1)


def test_saved_activations_keep_the_layout_inductor_chose_for_them():
    """Only the outputs the user sees keep their traced strides. A convolution's output that is
    saved for the backward stays channels-last, as Inductor computed it (with its layout
    optimization on, which it is on a CPU with mkldnn and on a GPU), rather than copied into the
    traced contiguous layout: a copy that costs a pass over every saved activation, and fuses
    into reductions big enough to spill registers."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("Inductor's layout optimization on a CPU needs mkldnn")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 4))
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model)
    x = torch.randn(2, 3, 8, 8)
    compiled(x).sum().backward()
    saved = []

    def pack(t):
        saved.append(t)
        return t

    x = torch.randn(2, 3, 8, 8)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = compiled(x)
    out.sum().backward()
    activations = [t for t in saved if t.dim() == 4 and t.shape[0] == 2 and t.shape[1] == 8]
    channels_last = [t for t in activations if not t.is_contiguous()
                     and t.is_contiguous(memory_format=torch.channels_last)]
    assert len(channels_last) >= 3, [t.stride() for t in activations]
    # and the outputs and gradients are eager's
    for p in (*model.parameters(), *reference.parameters()):
        p.grad = None
    got = compiled(x)
    got.sum().backward()
    expected = reference(x)
    expected.sum().backward()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4)
