"""Run in a fresh Python process by test_package_fresh_process.py (the save functions are
also called in the test process itself: only the loading side must be a fresh process):

    python _fresh_process.py save DIR BACKEND   compile, call and save packages into DIR
    python _fresh_process.py load DIR BACKEND   load them with capture, AOT and Inductor
                                                 compilation made to fail; check against eager
    python _fresh_process.py save_light DIR BACKEND / load_light DIR BACKEND
                                                 a static inference function and a training
                                                 step; the load imports no torch._dynamo and
                                                 no torch._inductor
    python _fresh_process.py save_dynamic DIR BACKEND / load_dynamic DIR BACKEND
                                                 a dynamic=True package: two new sizes are
                                                 served, a third that breaks a guard misses
    python _fresh_process.py save_higher_order DIR BACKEND / load_higher_order DIR BACKEND
                                                 torch.cond (both branches, with gradients)
                                                 and torch.while_loop, loaded with nothing
                                                 captured, traced or lowered
"""
import os
import sys

import torch

import kiln
import _pkg_models as M


def _models():
    torch.manual_seed(0)
    return M.MLP()


def save(d, backend):
    model = _models()
    x = torch.randn(2, 4)
    f = kiln.compile(M.f, backend=backend, dynamic=False)
    f(x, torch.randn(2, 4))
    f(torch.randn(3, 4), x[:1])
    g = kiln.compile(M.g, backend=backend)
    g(torch.randn(4))
    b = kiln.compile(M.with_break, backend=backend)
    b(x)
    m = kiln.compile(model, backend=backend)
    m(x)
    step = kiln.compile(M.train_step, backend=backend)
    step(model, x)
    af = kiln.compile(M.with_autograd_function, backend=backend)
    af(torch.randn(4, requires_grad=True)).backward()
    for name, c in [("f", f), ("g", g), ("b", b), ("m", m), ("step", step), ("af", af)]:
        report = c.save_package(os.path.join(d, f"{name}.kiln"))
        assert not report.left_out, report
    print("SAVED")


CALLED = []     # (kiln turns its own failures into eager runs: the calls are recorded too)


def _refuse(what):
    def refuse(*a, **k):
        CALLED.append(what)
        raise AssertionError(f"{what} ran in the process that loaded packages")
    return refuse


def load(d, backend):
    import kiln.runtime.function
    import kiln.aot.dynamic
    import kiln.aot.graph_capture
    import kiln.backends.inductor

    kiln.runtime.function.capture = _refuse("capture")
    kiln.aot.dynamic.compile_graph = _refuse("AOT autograd")
    kiln.aot.graph_capture.stage1_graph_capture = _refuse("AOT tracing")
    kiln.backends.inductor.GraphCompile.run = _refuse("Inductor")
    model = _models()
    p = lambda n: os.path.join(d, f"{n}.kiln")       # noqa: E731
    f = kiln.load_package(p("f"), M.f, on_miss="error")
    g = kiln.load_package(p("g"), M.g, on_miss="error")
    b = kiln.load_package(p("b"), M.with_break, on_miss="error")
    m = kiln.load_package(p("m"), model, on_miss="error")
    step = kiln.load_package(p("step"), M.train_step, on_miss="error")
    af = kiln.load_package(p("af"), M.with_autograd_function, on_miss="error")
    v = torch.randn(4, requires_grad=True)
    v2 = v.detach().clone().requires_grad_()
    af(v).backward()
    M.with_autograd_function(v2).backward()
    torch.testing.assert_close(v.grad, v2.grad)
    for x, y in [(torch.randn(2, 4), torch.randn(2, 4)), (torch.randn(3, 4), torch.randn(1, 4))]:
        torch.testing.assert_close(f(x, y), M.f(x, y))
    x = torch.randn(2, 4)
    v = torch.randn(4)
    torch.testing.assert_close(g(v), M.g(v))
    torch.testing.assert_close(b(x), M.with_break(x))
    torch.testing.assert_close(m(x), model(x))
    loss = step(model, x)
    grads = [q.grad.clone() for q in model.parameters()]
    model.zero_grad()
    torch.testing.assert_close(loss, M.train_step(model, x))
    for a, q in zip(grads, model.parameters()):
        torch.testing.assert_close(a, q.grad)
    assert "torch._inductor.lowering" not in sys.modules or backend == "inductor"
    assert not CALLED, CALLED
    print("LOADED OK")


def save_light(d, backend):
    torch.manual_seed(0)
    model = M.MLP()
    f = kiln.compile(M.f, backend=backend, dynamic=False)
    f(torch.randn(2, 4), torch.randn(2, 4))
    step = kiln.compile(M.train_step, backend=backend, dynamic=False)
    step(model, torch.randn(2, 4))
    for name, c in [("f", f), ("step", step)]:
        report = c.save_package(os.path.join(d, f"{name}.kiln"))
        assert not report.left_out and report.entries, report
    print("SAVED")


def load_light(d, backend):
    heavy = ("torch._dynamo", "torch._inductor")
    assert not any(m in sys.modules for m in heavy)      # (not by importing kiln either)
    torch.manual_seed(0)
    model = M.MLP()
    f = kiln.load_package(os.path.join(d, "f.kiln"), M.f, on_miss="error")
    step = kiln.load_package(os.path.join(d, "step.kiln"), M.train_step, on_miss="error")
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    torch.testing.assert_close(f(x, y), M.f(x, y))
    loss = step(model, x)
    grads = [q.grad.clone() for q in model.parameters()]
    model.zero_grad()
    torch.testing.assert_close(loss, M.train_step(model, x))
    for a, q in zip(grads, model.parameters()):
        torch.testing.assert_close(a, q.grad)
    loaded = [m for m in heavy if m in sys.modules]
    assert not loaded, f"a static package load imported {loaded}"
    print("LOADED LIGHT")


def save_dynamic(d, backend):
    c = kiln.compile(M.branchy, backend=backend, dynamic=True)
    for n in (3, 5):
        c(torch.randn(n, 4, requires_grad=True)).sum().backward()
    report = c.save_package(os.path.join(d, "branchy.kiln"))
    assert report.entries == 1 and not report.left_out, report
    print("SAVED")


def load_dynamic(d, backend):
    import kiln.runtime.function
    import kiln.aot.dynamic

    kiln.runtime.function.capture = _refuse("capture")
    kiln.aot.dynamic.compile_graph = _refuse("AOT autograd")
    fast = kiln.load_package(os.path.join(d, "branchy.kiln"), M.branchy, on_miss="error")
    for n in (4, 7):                  # sizes the package never saw, within its guards
        x = torch.randn(n, 4, requires_grad=True)
        out = fast(x)
        ref_x = x.detach().clone().requires_grad_(True)
        ref = M.branchy(ref_x)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x.grad, ref_x.grad)
    try:
        fast(torch.randn(12, 4, requires_grad=True))      # breaks the guard size <= 8
    except kiln.PackageMiss as e:
        assert "<= 8" in str(e), e
    else:
        raise AssertionError("a size outside the guards was served")
    assert not CALLED, CALLED
    print("LOADED DYNAMIC")


def save_higher_order(d, backend):
    cond = kiln.compile(M.with_cond, backend=backend, fullgraph=True)
    cond(M.signed((4, 3), 1), torch.randn(4, 3))
    cond(M.signed((4, 3), -1).requires_grad_(), torch.randn(4, 3)).sum().backward()   # training too
    loop = kiln.compile(M.with_while_loop, backend=backend, fullgraph=True)
    loop(torch.rand(4), torch.rand(4))
    for name, c in [("cond", cond), ("loop", loop)]:
        report = c.save_package(os.path.join(d, f"{name}.kiln"))
        assert report.entries > 0 and not report.left_out, report
    print("SAVED")


def load_higher_order(d, backend):
    import kiln.runtime.function
    import kiln.aot.dynamic
    import kiln.aot.graph_capture
    import kiln.backends.inductor

    kiln.runtime.function.capture = _refuse("capture")
    kiln.aot.dynamic.compile_graph = _refuse("AOT autograd")
    kiln.aot.graph_capture.stage1_graph_capture = _refuse("AOT tracing")
    kiln.backends.inductor.GraphCompile.run = _refuse("Inductor")
    cond = kiln.load_package(os.path.join(d, "cond.kiln"), M.with_cond, on_miss="error")
    loop = kiln.load_package(os.path.join(d, "loop.kiln"), M.with_while_loop, on_miss="error")
    for sign in (1, -1, -1, 1):                 # both branches, inference
        x, y = M.signed((4, 3), sign), torch.randn(4, 3)
        torch.testing.assert_close(cond(x, y), M.with_cond(x, y))
    for sign in (-1, 1):                        # both branches, with gradients
        x, y = M.signed((4, 3), sign), torch.randn(4, 3)
        xa, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, ref = cond(xa, y), M.with_cond(xe, y)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(xa.grad, xe.grad)
    for scale in (0.1, 1, 10, 1000):            # 5 trips down to none
        x, w = torch.rand(4) * scale, torch.rand(4)
        torch.testing.assert_close(loop(x, w), M.with_while_loop(x, w))
    assert not CALLED, CALLED
    print("LOADED HIGHER ORDER")


if __name__ == "__main__":
    {"save": save, "load": load, "save_light": save_light, "load_light": load_light,
     "save_dynamic": save_dynamic, "load_dynamic": load_dynamic,
     "save_higher_order": save_higher_order, "load_higher_order": load_higher_order,
     }[sys.argv[1]](sys.argv[2], sys.argv[3])
