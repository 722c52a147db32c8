"""save_package / load_package in one process: every entry comes back, matched by its saved
guards before any capture (kiln.reset() first: the loaded function has no entries of its own)."""
import pytest
import torch

import kiln
from kiln.package import PackageMiss

import _pkg_models as M


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _no_capture(monkeypatch):
    """Capturing now fails the test: a loaded entry must answer the call."""
    import kiln.runtime.function

    def refuse(*a, **k):
        pytest.fail("capture ran for a call the package covers")
    monkeypatch.setattr(kiln.runtime.function, "capture", refuse)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_function_several_shapes(tmp_path, monkeypatch, backend):
    c = kiln.compile(M.f, backend=backend, dynamic=False)
    shapes = [(3, 4), (5, 4), (2, 7)]
    for s in shapes:
        c(torch.randn(s), torch.randn(s))
    report = c.save_package(tmp_path / "f.kiln")
    assert report.saved == {"f": 3} and not report.left_out
    kiln.reset()
    _no_capture(monkeypatch)
    fast = kiln.load_package(tmp_path / "f.kiln", kiln.compile(M.f, backend=backend), on_miss="error")
    assert len(fast.entries) == 3
    for s in shapes:
        x, y = torch.randn(s), torch.randn(s)
        torch.testing.assert_close(fast(x, y), M.f(x, y))


def test_global_tensor_and_default(tmp_path, monkeypatch):
    cg = kiln.compile(M.g, backend="aot_eager")
    cd = kiln.compile(M.with_default, backend="aot_eager", dynamic=False)
    x = torch.randn(4)
    cg(x), cd(x), cd(x, k=5)
    cg.save_package(tmp_path / "g.kiln")
    assert cd.save_package(tmp_path / "d.kiln").entries == 2
    kiln.reset()
    _no_capture(monkeypatch)
    fg = kiln.load_package(tmp_path / "g.kiln", M.g, on_miss="error")
    fd = kiln.load_package(tmp_path / "d.kiln", M.with_default, on_miss="error")
    x = torch.randn(4)
    torch.testing.assert_close(fg(x), M.g(x))
    torch.testing.assert_close(fd(x), M.with_default(x))
    torch.testing.assert_close(fd(x, k=5), M.with_default(x, k=5))
    # the global tensor is read again in this process: a new value is seen, not a saved copy
    old = M.SCALE.clone()
    try:
        M.SCALE.add_(10)
        torch.testing.assert_close(fg(x), M.g(x))
    finally:
        M.SCALE.copy_(old)


def test_graph_break_continuations(tmp_path, monkeypatch):
    c = kiln.compile(M.with_break, backend="aot_eager")
    x = torch.randn(3)
    c(x)
    report = c.save_package(tmp_path / "b.kiln")
    assert report.entries == 2 and len(report.saved) == 2   # the function and its continuation
    kiln.reset()
    _no_capture(monkeypatch)
    fast = kiln.load_package(tmp_path / "b.kiln", M.with_break, on_miss="error")
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), M.with_break(x))
    assert fast.entries[0].graph_break is not None and fast.entries[0].resumes[0].entries


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_module_inference_and_training_step(tmp_path, monkeypatch, backend):
    torch.manual_seed(0)
    m = M.MLP()
    cm = kiln.compile(m, backend=backend, dynamic=False)
    step = kiln.compile(M.train_step, backend=backend, dynamic=False)
    x = torch.randn(2, 4)
    cm(x)
    step(m, x)
    m.zero_grad()
    cm.save_package(tmp_path / "m.kiln")
    step.save_package(tmp_path / "t.kiln")
    kiln.reset()
    _no_capture(monkeypatch)
    fm = kiln.load_package(tmp_path / "m.kiln", m, on_miss="error")
    fstep = kiln.load_package(tmp_path / "t.kiln", M.train_step, on_miss="error")
    x = torch.randn(2, 4)
    torch.testing.assert_close(fm(x), m(x))
    loss = fstep(m, x)
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    ref = M.train_step(m, x)
    torch.testing.assert_close(loss, ref)
    for a, p in zip(grads, m.parameters()):
        torch.testing.assert_close(a, p.grad)


def test_several_functions_of_one_file(tmp_path, monkeypatch):
    fns = [M.f, M.uses_helper]
    x = torch.randn(3)
    for i, fn in enumerate(fns):
        c = kiln.compile(fn, backend="aot_eager")
        c(*([x, x] if fn is M.f else [x]))
        c.save_package(tmp_path / f"{i}.kiln")
    kiln.reset()
    _no_capture(monkeypatch)
    loaded = [kiln.load_package(tmp_path / f"{i}.kiln", fn, on_miss="error") for i, fn in enumerate(fns)]
    torch.testing.assert_close(loaded[0](x, x), M.f(x, x))
    torch.testing.assert_close(loaded[1](x), M.uses_helper(x))


def test_miss_error_names_the_failing_guard(tmp_path):
    c = kiln.compile(M.f, backend="aot_eager", dynamic=False)
    c(torch.randn(3), torch.randn(3))
    c.save_package(tmp_path / "f.kiln")
    kiln.reset()
    fast = kiln.load_package(tmp_path / "f.kiln", M.f, on_miss="error")
    with pytest.raises(PackageMiss, match=r"TENSOR_MATCH failed.*size"):
        fast(torch.randn(5), torch.randn(5))
    with pytest.raises(PackageMiss, match=r"TENSOR_MATCH failed.*stride"):
        fast(torch.randn(6)[::2], torch.randn(3))
    with pytest.raises(PackageMiss, match=r"TENSOR_MATCH failed.*(dtype|dispatch)"):
        fast(torch.randn(3).double(), torch.randn(3))


def test_miss_compile_logs_and_compiles(tmp_path, capsys):
    c = kiln.compile(M.f, backend="aot_eager", dynamic=False)
    c(torch.randn(3), torch.randn(3))
    c.save_package(tmp_path / "f.kiln")
    kiln.reset()
    fast = kiln.load_package(tmp_path / "f.kiln", M.f)
    kiln.set_logs("package")
    try:
        x = torch.randn(5)
        torch.testing.assert_close(fast(x, x), M.f(x, x))
    finally:
        kiln.set_logs(None)
    assert "miss in package" in capsys.readouterr().err
    assert len(fast.entries) == 2


def test_dynamic_aot_entry_serves_the_sizes_its_guards_allow(tmp_path, monkeypatch):
    """A dynamic=True aot_eager entry is packaged with its symbolic sizes; a load (no capture
    ShapeEnv) rebuilds the same AOT result, field by field, and serves new sizes."""
    from kiln.aot.runtime import wrapper_to_dict
    from kiln.aot import symbolic_codec as C

    c = kiln.compile(M.branchy, backend="aot_eager", dynamic=True)
    c(torch.randn(3, 4, requires_grad=True))
    c(torch.randn(5, 4, requires_grad=True))
    assert len(c.entries) == 1
    compiled = c.entries[0].compiled_graph
    report = c.save_package(tmp_path / "b.kiln")
    assert report.entries == 1 and not report.left_out
    kiln.reset()
    _no_capture(monkeypatch)
    fast = kiln.load_package(tmp_path / "b.kiln", M.branchy, on_miss="error")
    loaded = fast.entries[0].compiled_graph
    p, q = compiled.parts, loaded.parts
    assert p.symbolic and q.symbolic
    for field in ("kind", "num_fw_outputs", "tangent_positions", "fw_output_requires_grad",
                  "primal_requires_grad", "grad_enabled", "saved", "saved_bytes", "saved_input_bytes",
                  "partitioner", "grad_dependencies", "check_inputs", "check_outputs", "copy_saved",
                  "watch", "late_demand", "saved_demand", "trace_guards", "input_guards", "input_ranges"):
        assert getattr(p, field) == getattr(q, field), field
    assert [wrapper_to_dict(w) for w in p.wrappers] == [wrapper_to_dict(w) for w in q.wrappers]
    assert p.forward.code == q.forward.code and p.backward.code == q.backward.code
    assert [C.encode_value(v) for v in p.input_fakes] == [C.encode_value(v) for v in q.input_fakes]
    assert compiled.input_check.conditions == loaded.input_check.conditions
    for n in (4, 6, 8):         # (2 would make the slice's size 1: a guard says != 1)
        x = torch.randn(n, 4, requires_grad=True)
        rx = x.detach().clone().requires_grad_(True)
        out, ref = fast(x), M.branchy(rx)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x.grad, rx.grad)
    with pytest.raises(PackageMiss, match="<= 8"):
        fast(torch.randn(9, 4, requires_grad=True))


def test_dynamic_eager_entry_serves_new_sizes(tmp_path, monkeypatch):
    c = kiln.compile(M.f, backend="eager", dynamic=True)
    c(torch.randn(3, 4), torch.randn(3, 4))
    assert c.save_package(tmp_path / "f.kiln").entries == 1
    kiln.reset()
    _no_capture(monkeypatch)
    fast = kiln.load_package(tmp_path / "f.kiln", M.f, on_miss="error")
    for n in (5, 9):
        x, y = torch.randn(n, 4), torch.randn(n, 4)
        torch.testing.assert_close(fast(x, y), M.f(x, y))
    with pytest.raises(PackageMiss):
        fast(torch.randn(5, 4).double(), torch.randn(5, 4).double())    # another dtype


def test_a_function_made_by_the_caller_is_matched_by_its_code(tmp_path):
    """A function argument made by the caller (a nested function) is guarded by its code,
    globals and defaults, not by identity: its code is found again as a constant of the named
    function that defines it, so the entry is saved; a named function is saved by its name."""
    def apply(fn, x):
        return fn(x) + 1

    def make_local():
        def local(x):
            return x * 3
        return local
    c = kiln.compile(apply, backend="eager")
    x = torch.randn(3)
    c(make_local(), x)
    c(torch.sin, x)
    report = c.save_package(tmp_path / "a.kiln")
    assert report.entries == 2 and not report.left_out, report
    kiln.reset()
    fast = kiln.load_package(tmp_path / "a.kiln", apply, on_miss="error")
    torch.testing.assert_close(fast(torch.sin, x), apply(torch.sin, x))
    torch.testing.assert_close(fast(make_local(), x), apply(make_local(), x))   # a new one, same code
    with pytest.raises(PackageMiss, match="ID_MATCH"):
        fast(torch.cos, x)


def test_an_object_made_in_the_call_is_left_out(tmp_path):
    """A guard on an object with no name anywhere (a class made at run time) leaves its entry
    out, with the reason."""
    def apply(fn, x):
        return fn(x) + 1
    Made = type("Made", (), {"__call__": lambda self, x: x * 3})
    c = kiln.compile(apply, backend="eager")
    x = torch.randn(3)
    c(Made(), x)
    report = c.save_package(tmp_path / "b.kiln")
    assert report.entries == 0 and len(report.left_out) == 1, report
    assert "no name" in report.left_out[0].reason


def test_closure_cells_resolve_against_the_loaded_function(tmp_path, monkeypatch):
    inner = M.make_scaled(2.0)
    c = kiln.compile(inner, backend="aot_eager")
    x = torch.randn(3)
    c(x)
    assert c.save_package(tmp_path / "c.kiln").entries == 1
    kiln.reset()
    _no_capture(monkeypatch)
    same = M.make_scaled(2.0)          # a new closure, same code and cell value
    fast = kiln.load_package(tmp_path / "c.kiln", same, on_miss="error")
    torch.testing.assert_close(fast(x), same(x))
    other = kiln.load_package(tmp_path / "c.kiln", M.make_scaled(5.0), on_miss="error")
    with pytest.raises(PackageMiss, match="scale"):
        other(x)                       # the cell's value is guarded: another value misses


def test_method_and_eager_entries(tmp_path, monkeypatch):
    obj = M.Counter()
    cm = kiln.compile(obj.step, backend="aot_eager")
    cu = kiln.compile(M.unsupported, backend="aot_eager")
    x = torch.randn(4)
    cm(x)
    cu(x)
    cm.save_package(tmp_path / "m.kiln")
    cu.save_package(tmp_path / "u.kiln")
    kiln.reset()
    _no_capture(monkeypatch)
    fm = kiln.load_package(tmp_path / "m.kiln", obj.step, on_miss="error")
    fu = kiln.load_package(tmp_path / "u.kiln", M.unsupported, on_miss="error")
    torch.testing.assert_close(fm(x), obj.step(x))
    torch.testing.assert_close(fu(x), M.unsupported(x))
    assert fu.entries[0].graph_break is not None


def test_eager_fallback_entry(tmp_path, monkeypatch):
    c = kiln.compile(M.generator_frame, backend="aot_eager")
    x = torch.randn(3)
    list(c(x))
    assert c.entries[0].is_eager
    assert c.save_package(tmp_path / "e.kiln").entries == 1
    kiln.reset()
    _no_capture(monkeypatch)
    fast = kiln.load_package(tmp_path / "e.kiln", M.generator_frame, on_miss="error")
    got = list(fast(x))
    torch.testing.assert_close(got[1], x * 2)
    assert fast.entries[0].is_eager and "generator" in str(fast.entries[0].eager_reason)


def test_module_forward_defaults_resolve_by_name(tmp_path, monkeypatch):
    m = M.Masked()
    c = kiln.compile(m, backend="aot_eager", dynamic=False)
    x = torch.randn(2, 4)
    c(x)
    c(x, torch.ones(4))
    assert c.save_package(tmp_path / "m.kiln").entries == 2     # (None's type: types.NoneType)
    kiln.reset()
    _no_capture(monkeypatch)
    fast = kiln.load_package(tmp_path / "m.kiln", m, on_miss="error")
    mask = torch.rand(4)
    torch.testing.assert_close(fast(x), m(x))
    torch.testing.assert_close(fast(x, mask), m(x, mask))


def test_entry_that_cannot_load_is_skipped_with_a_warning(tmp_path, monkeypatch):
    c = kiln.compile(M.apply, backend="eager")
    x = torch.randn(3)
    c(M.double, x)              # identity guard on M.double: saved by its qualified name
    assert c.save_package(tmp_path / "a.kiln").entries == 1
    kiln.reset()
    monkeypatch.delattr(M, "double")
    with pytest.warns(RuntimeWarning, match="could not be loaded"):
        fast = kiln.load_package(tmp_path / "a.kiln", M.apply, check_source=False)
    assert not fast.entries
    torch.testing.assert_close(fast(torch.cos, x), M.apply(torch.cos, x))   # compiles as usual


def test_continuation_miss_follows_on_miss(tmp_path, monkeypatch):
    c = kiln.compile(M.with_break_flag, backend="eager")
    x = torch.randn(3)
    c(x)
    c.save_package(tmp_path / "b.kiln")
    kiln.reset()
    fast = kiln.load_package(tmp_path / "b.kiln", M.with_break_flag, on_miss="error")
    torch.testing.assert_close(fast(x), M.with_break_flag(x))
    monkeypatch.setattr(M, "FLAG", 3.0)      # the continuation's guard fails, not the entry's
    with pytest.raises(PackageMiss, match="__kiln_resume_with_break_flag.*FLAG"):
        fast(x)


def test_a_continuation_several_entries_resume_in_is_saved_once(tmp_path, monkeypatch):
    # two entries (static, then dynamic after a new size) per continuation of a loop with a
    # graph break per iteration: saved under every entry, it took 2^iterations saves
    from kiln.package import fileformat
    from kiln.package.entries import resume_groups

    c = kiln.compile(M.loop_with_breaks, backend="aot_eager")
    xs = [torch.randn(n) for n in (4, 5, 6)]
    for x in xs:
        torch.testing.assert_close(c(x, 8), M.loop_with_breaks(x, 8))
    report = c.save_package(tmp_path / "p.kiln")
    assert not report.left_out, report
    manifest = fileformat.read(str(tmp_path / "p.kiln")).manifest
    groups = list(resume_groups(manifest["entries"]))
    refs = [r for s in [*manifest["entries"], *(e for g in groups for e in g["entries"])]
            for r in (s["break"] or {}).get("resumes", ()) if "ref" in r]
    # one group per continuation (one per iteration), each saved once; the other entries refer to it
    assert len(groups) == 8, len(groups)
    assert len(refs) >= 7, len(refs)
    kiln.reset()
    _no_capture(monkeypatch)
    fast = kiln.load_package(tmp_path / "p.kiln", M.loop_with_breaks, on_miss="error")
    for x in [*xs, torch.randn(7)]:
        torch.testing.assert_close(fast(x, 8), M.loop_with_breaks(x, 8))


def test_loaded_module_entry_skips_guards_of_an_unchanged_tree(tmp_path, monkeypatch):
    """A loaded entry takes its own snapshot of the module tree (kiln/capture/module_state.py)
    and still sees a change made after it."""
    from kiln.capture import module_state

    m = M.MLP()
    cm = kiln.compile(m, backend="eager", dynamic=False)
    cm(torch.randn(2, 4))
    cm.save_package(tmp_path / "m.kiln")
    kiln.reset()
    _no_capture(monkeypatch)
    fm = kiln.load_package(tmp_path / "m.kiln", m, on_miss="error")
    for _ in range(3):
        x = torch.randn(2, 4)
        torch.testing.assert_close(fm(x), m(x))
    memos = [v for e in fm.entries for v in _closure_values(e.fn) if isinstance(v, module_state.ModuleStateMemo)]
    if module_state.NATIVE is not None:
        assert memos and all(mm.used for mm in memos)
    monkeypatch.undo()                  # (a changed tree: capture may run again)
    m.fc1.weight = torch.nn.Parameter(torch.randn(m.fc1.weight.shape))
    x = torch.randn(2, 4)
    torch.testing.assert_close(fm(x), m(x))


def _closure_values(fn):
    return [c.cell_contents for c in fn.__closure__ or ()]


def test_identity_guard_on_none_is_saved(tmp_path, monkeypatch):
    """``self.attr is None`` of a class attribute guards that it is None: saved like any
    constant (it was refused as "the object was freed")."""
    m = M.ClassAttributeNone()
    c = kiln.compile(m, backend="aot_eager")
    x = torch.randn(2, 4)
    c(x)
    report = c.save_package(tmp_path / "none.kiln")
    assert not report.left_out, report
    kiln.reset()
    _no_capture(monkeypatch)
    fast = kiln.load_package(tmp_path / "none.kiln", m, on_miss="error")
    torch.testing.assert_close(fast(x), m(x))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_training_step_with_a_break_and_changing_shapes(tmp_path, monkeypatch, backend):
    """A training step with a graph break whose first graph hands a tensor that requires grad
    to the continuation, called with three batch sizes (the second makes them dynamic): every
    entry is saved, and the package serves new sizes with nothing captured."""
    torch.manual_seed(0)
    m = M.MLP()
    step = kiln.compile(M.break_train_step, backend=backend)
    for n in (2, 3, 5):
        step(m, torch.randn(n, 4))
    m.zero_grad()
    report = step.save_package(tmp_path / "s.kiln")
    assert report.entries >= 2 and not report.left_out, report
    kiln.reset()
    _no_capture(monkeypatch)
    with kiln.config.patch(cache=False):
        fast = kiln.load_package(tmp_path / "s.kiln", M.break_train_step, on_miss="error")
        for n in (3, 5, 4):
            x = torch.randn(n, 4)
            loss = fast(m, x)
            grads = [p.grad.clone() for p in m.parameters()]
            m.zero_grad()
            torch.testing.assert_close(loss, M.break_train_step(m, x))
            for a, p in zip(grads, m.parameters()):
                torch.testing.assert_close(a, p.grad)
            m.zero_grad()




class _Marker:
    pass


MARK = _Marker()


def _marked(x, m):
    return x + 1 if m is MARK else x - 1



def test_a_global_rebound_after_an_earlier_save_is_not_saved_as_found(tmp_path):
    """An entry's saved form is kept from one save to the next (a frame record is written
    after every compile), but each save still checks that what its code and guards read is
    where its encoding says: a class rebound since then is another object there."""
    global _Marker
    c = kiln.compile(_marked, backend="aot_eager")
    c(torch.randn(3), MARK)
    assert c.save_package(tmp_path / "a.kiln").saved == {"_marked": 1}
    cls, _Marker = _Marker, type("_Marker", (), {})
    try:
        report = c.save_package(tmp_path / "b.kiln")
    finally:
        _Marker = cls
    assert not report.saved.get("_marked") and len(report.left_out) == 1
    assert "come back" in str(report.left_out[0]), report.left_out
