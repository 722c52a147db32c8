"""kiln's loader of Inductor's generated modules (``kiln.backends.inductor.generated_module``): the
same source and C++ kernels, without importing Inductor; anything it cannot load itself is
left to Inductor's loader. One tiny graph compiled once for the module."""
import os

import pytest
import torch

import kiln
from kiln import _torch
from kiln.backends.inductor import generated_module as G


@pytest.fixture(scope="module")
def compiled_code(tmp_path_factory):
    """(the stored code of a compiled inference graph, its inputs, eager's output)."""
    records = []
    orig = _torch.inductor_generated_code

    def spy(compiled):
        code = orig(compiled)
        records.append((code, _torch.inductor_module_globals(compiled)))
        return code
    _torch.inductor_generated_code = spy
    try:
        kiln.reset()
        cached, kiln.config.cache = kiln.config.cache, False     # (compiled here, not loaded)
        lin = torch.nn.Linear(4, 3)

        def f(x):
            return torch.relu(lin(x)) * 2
        x = torch.randn(2, 4)
        with torch.no_grad():
            kiln.compile(f, backend="inductor")(x)
            ref = f(x)
    finally:
        _torch.inductor_generated_code = orig
        kiln.config.cache = cached
        kiln.reset()
    code, module_globals = records[-1]
    return code, module_globals, [x, lin.weight.detach(), lin.bias.detach()], ref


def _run(module, code, args):
    phs = [a for a in args]
    return module.call(phs)


def test_the_module_loads_with_its_kernels_and_computes_the_same(compiled_code, tmp_path):
    code, module_globals, args, ref = compiled_code
    fast = G.describe(code["source_code"], module_globals)
    assert fast is not None and fast["kernels"], "the C++ kernel's library is kept"
    assert "torch._inductor" not in fast["source"].split("def call")[0].replace("__kiln_rt__.get('torch._inductor", "")
    module = G.load(fast, code["constants"], str(tmp_path / "kernels"))
    assert module is not None
    assert len(os.listdir(tmp_path / "kernels")) == len(fast["kernels"])
    # the graph's placeholders are in the order the graph takes them; try the permutations
    # of the three inputs that fit
    import itertools
    outs = []
    for perm in itertools.permutations(args):
        try:
            outs.append(module.call(list(perm)))
        except (AssertionError, RuntimeError, IndexError):
            continue
    assert any(torch.allclose(o[0] if isinstance(o, (tuple, list)) else o, ref) for o in outs)


def test_another_machine_loads_it_as_inductor_does(compiled_code, tmp_path):
    code, module_globals, _, _ = compiled_code
    fast = G.describe(code["source_code"], module_globals)
    assert G.load({**fast, "machine": "another"}, code["constants"], str(tmp_path)) is None
    assert G.load({**fast, "format": -1}, code["constants"], str(tmp_path)) is None
    assert G.load(None, code["constants"], str(tmp_path)) is None


def test_a_damaged_kernel_file_is_replaced_before_it_is_loaded(compiled_code, tmp_path):
    code, module_globals, _, _ = compiled_code
    fast = G.describe(code["source_code"], module_globals)
    kdir = tmp_path / "k"
    data = next(iter(fast["kernels"].values()))
    name = G._digest(data)[:32] + ".so"
    kdir.mkdir()
    (kdir / name).write_bytes(data[: len(data) // 2])          # truncated
    for mod in [m for m in list(__import__("sys").modules) if m.startswith("kiln_kernels_")]:
        del __import__("sys").modules[mod]
    assert G.load(fast, code["constants"], str(kdir)) is not None
    assert (kdir / name).read_bytes() == data


def test_kernel_kinds_kiln_does_not_load_are_left_to_inductor():
    src = "from torch._inductor.async_compile import AsyncCompile\nasync_compile = AsyncCompile()\n" \
          "k = async_compile.halide('k', '''src''')\n"
    assert G.describe(src, {"k": object()}) is None


def test_other_inductor_imports_resolve_when_first_used(tmp_path):
    src = "from torch._inductor.utils import ceildiv as cd\n" \
          "from torch._inductor.async_compile import AsyncCompile\n" \
          "async_compile = AsyncCompile()\nasync_compile.wait(globals())\n" \
          "def call(args):\n    return cd(args[0], args[1])\n"
    fast = G.describe(src, {})
    assert "__kiln_rt__.get('torch._inductor.utils', 'ceildiv')" in fast["source"]
    module = G.load(fast, {}, str(tmp_path))
    assert module.call([7, 2]) == 4


def test_realigned_inputs_are_copied_back_when_mutated():
    def call(args):
        assert args[0].data_ptr() % G.ALIGNMENT == 0
        args[0].add_(1)
        return args[0] * 2

    base = torch.zeros(9)
    x = base[1:5]                        # 4 bytes off: misaligned
    assert x.data_ptr() % G.ALIGNMENT
    out = G.realign_inputs(call, [0], {0})([x])
    assert torch.equal(x, torch.ones(4)) and torch.equal(out, torch.full((4,), 2.0))
