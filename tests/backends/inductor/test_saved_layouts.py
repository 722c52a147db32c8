"""A backward reads its saved tensors with the layouts its own forward returned them in, also
when it is compiled later than other forwards of the same captured graph (a chain of parts, a
compile per shape) and when it is a partial backward made at run time (a Falcon-H1 training
step crashed in Inductor's size/stride assert on a saved split-and-transposed value)."""
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

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
