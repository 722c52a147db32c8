"""An Inductor entry compiled on one GPU, rebound to run on another (device_rebinding.py): the
ranks of one machine share their compiles. The rewriting is checked here on the forms
Inductor writes; the two-GPU tests run the rebound code and check that it touches only its
own device."""
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.aot.export import FORMAT, VERSION, AOTArtifact
from kiln.backends.inductor.device_rebinding import rebind_source
from kiln.backends.inductor.generated_module import cuda_device, module_digest
from kiln.cache import key as K

ROOT = os.path.dirname(os.path.dirname(kiln.__file__))

# The device-naming forms of a module Inductor generates for a CUDA graph (torch 2.11-2.13).
MODULE = textwrap.dedent('''
    from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
    from torch._C import _cuda_getCurrentRawStream as get_raw_stream
    empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
    triton_poi_fused_relu_0 = async_compile.triton('triton_poi_fused_relu_0', """
    @triton_heuristics.pointwise(size_hints={'x': 128}, filename=__file__,
        triton_meta={'signature': {'in_out_ptr0': '*fp32', 'xnumel': 'i32'}, 'device': DeviceProperties(type='cuda', index=1, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, warp_size=32), 'constants': {}},
        inductor_meta={'kernel_name': 'triton_poi_fused_relu_0', 'mutated_arg_names': ['in_out_ptr0']})
    @triton.jit
    def triton_poi_fused_relu_0(in_out_ptr0, xnumel, XBLOCK : tl.constexpr):
        xoffset = tl.program_id(0) * XBLOCK
    """, device_str='cuda')
    # Topologically Sorted Source Nodes: [relu], Original ATen: [aten.relu]
    #   %arg0_1 : Tensor "f32[8, 16][16, 1]cuda:1" = PlaceHolder[target=arg0_1]
    def call(args):
        arg0_1, arg1_1 = args
        with torch.cuda._DeviceGuard(1):
            torch.cuda.set_device(1)
            buf0 = empty_strided_cuda((8, 4), (4, 1), torch.float32)
            extern_kernels.mm(arg0_1, arg1_1, out=buf0)
            stream1 = get_raw_stream(1)
            triton_poi_fused_relu_0.run(buf0, 32, stream=stream1)
            buf1 = torch.ops.aten.full.default([2], 0.0, device=device(type='cuda', index=1), pin_memory=False)
            state = torch.cuda.default_generators[1].graphsafe_get_state()
        return (buf0, buf1)
    def benchmark_compiled_module(times=10, repeat=10):
        arg0_1 = rand_strided((8, 16), (16, 1), device='cuda:1', dtype=torch.float32)
''')


def test_every_form_naming_the_device_is_rebound():
    out = rebind_source(MODULE, 1, 3)
    assert "index=1" not in out and "(1)" not in out and "cuda:1" not in out and "[1]" not in out
    for form in ("_DeviceGuard(3)", ".set_device(3)", "get_raw_stream(3)", "device(type='cuda', index=3)",
                 "DeviceProperties(type='cuda', index=3,", "default_generators[3]", "device='cuda:3'"):
        assert form in out, form
    # the rest is untouched: names, sizes, the kernel's code
    assert out.replace("3", "1") == MODULE.replace("3", "1")
    assert "stream1 = get_raw_stream(3)" in out and "(8, 4), (4, 1)" in out
    assert '"f32[8, 16][16, 1]cuda:3" = PlaceHolder' in out
    assert cuda_device(out) == 3 and cuda_device(MODULE) == 1
    assert rebind_source(out, 3, 1) == MODULE


def test_a_module_naming_another_device_or_an_unknown_form_is_not_rebound():
    with pytest.raises(ValueError, match="names CUDA device 0 besides 1"):
        rebind_source(MODULE + "\nwith torch.cuda._DeviceGuard(0):\n    pass\n", 1, 2)
    with pytest.raises(ValueError, match="form kiln does not rebind"):
        rebind_source(MODULE + "\nstream = get_raw_stream(device_index)\n", 1, 2)
    with pytest.raises(ValueError, match="form kiln does not rebind"):
        rebind_source(MODULE + "\nx = torch.empty(2, device=torch.device('cuda', index=1))\n", 1, 2)


def test_recorded_kernels_keep_the_name_of_the_module_as_compiled():
    fast = {"source": MODULE}
    rebound = {"source": rebind_source(MODULE, 1, 0), "record_digest": module_digest(fast)}
    assert module_digest(rebound) == module_digest(fast)


def test_the_artifact_moves_every_device_string_and_nothing_else():
    meta = {"graphs": {"forward": {"nodes": [
        {"op": "call_function", "kwargs": {"dict": [["device", {"device": "cuda:1"}]]}, "devices": ["cuda:1"]},
        {"op": "placeholder", "meta": {"shape": [2], "device": "cuda:1"}},
        {"op": "call_function", "args": ["cuda:10", "cuda:1x", {"device": "cpu"}]}]}}}
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "version": VERSION, "meta": json.dumps(meta), "constants": {"c": torch.ones(2)}}, buf)
    obj = torch.load(io.BytesIO(AOTArtifact.rebind_cuda(buf.getvalue(), 1, 0)), weights_only=True)
    nodes = json.loads(obj["meta"])["graphs"]["forward"]["nodes"]
    assert nodes[0]["kwargs"] == {"dict": [["device", {"device": "cuda:0"}]]} and nodes[0]["devices"] == ["cuda:0"]
    assert nodes[1]["meta"]["device"] == "cuda:0"
    assert nodes[2]["args"] == ["cuda:10", "cuda:1x", {"device": "cpu"}]
    torch.testing.assert_close(obj["constants"]["c"], torch.ones(2))


def _graph_on(index: int) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    z = g.call_function(torch.ops.aten.zeros.default, ([4],), {"device": torch.device("cuda", index)})
    g.output(g.call_function(torch.ops.aten.add.Tensor, (x, z)))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_the_key_of_a_graph_on_one_gpu_leaves_its_index_out():
    a, b = _graph_on(0), _graph_on(1)
    assert K.cuda_indices(a, []) == [0] and K.cuda_indices(b, []) == [1]
    assert K.graph_text(a, [], cuda=0) == K.graph_text(b, [], cuda=1)
    assert K.graph_text(a, []) != K.graph_text(b, [])       # (a backend that cannot rebind)
    assert K.graph_text(a, [], cuda=1) != K.graph_text(b, [], cuda=1)


# ------------------------------------------------------------------------------------------------
# Two GPUs: a process compiles on one, fresh processes load on the other
# ------------------------------------------------------------------------------------------------

needs_two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                    reason="needs two CUDA devices")

_CHILD = textwrap.dedent("""
    import json, sys, torch, kiln
    import torch.nn.functional as F
    dev, mode = int(sys.argv[1]), sys.argv[2]
    torch.cuda.set_device(dev)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(64)
            self.up = torch.nn.Linear(64, 256)
            self.down = torch.nn.Linear(256, 64)

        def forward(self, x):
            h = self.down(F.gelu(self.up(self.norm(x))))
            return x + h + torch.ones(64, device=x.device) * 0.5

    torch.manual_seed(0)
    model = Block().cuda()
    ref = Block().cuda()
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, mode="reduce-overhead" if mode == "infer" else "default")
    for step in range(3):
        x = torch.randn(8, 16, 64, device="cuda")
        if mode == "infer":
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-4)
        else:
            out, expected = compiled(x), ref(x)
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
            out.square().mean().backward()
            expected.square().mean().backward()
            for p, q in zip(model.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    torch.cuda.synchronize()
    other = 1 - dev
    print("RESULT " + json.dumps({**kiln.cache.stats(), "other_device_bytes": torch.cuda.memory_allocated(other)}))
""")


def _child(tmp_path, dev: int, mode: str) -> dict:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    proc = subprocess.run([sys.executable, str(script), str(dev), mode], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": ROOT, "KILN_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])


@needs_two_gpus
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_an_entry_compiled_on_one_gpu_runs_rebound_on_the_other(tmp_path, mode):
    first = _child(tmp_path, 0, mode)
    assert first["misses"] > 0
    # rebound (its Triton kernels, recorded on cuda:0, loaded onto cuda:1); then from cuda:1's
    # own frame records; then cuda:0's again
    for dev in (1, 1, 0):
        r = _child(tmp_path, dev, mode)
        assert r["misses"] == 0 and r["hits"] + r["frame_hits"] > 0, r
        assert r["other_device_bytes"] == 0, r       # nothing ran on the GPU it was compiled for
