"""The dynamic-shape profile: dims found dynamic survive the process (KILN_CACHE_DIR), a
corrupt profile is ignored with a warning, and profiles are keyed by the code's identity."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.shapes.profile import code_identity, profile_for, profile_path
from kiln.testing import CompileCounter

SCRIPT = textwrap.dedent("""
    import json, sys, torch, kiln
    from kiln.testing import CompileCounter

    def block(x, w):
        b, t, c = x.shape
        h = (x @ w).view(b, t, 2, c // 2).transpose(1, 2)
        att = (h @ h.transpose(-1, -2)).softmax(-1)
        return (att @ h).transpose(1, 2).reshape(b, t, c)

    cnt = CompileCounter()
    f = kiln.compile(block, backend=cnt)
    w = torch.randn(16, 16)
    for t in [int(a) for a in sys.argv[1:]]:
        x = torch.randn(2, t, 16)
        torch.testing.assert_close(f(x, w), block(x, w))
    print(json.dumps({"graphs": cnt.frame_count, "symbols": f.entries[0].symbols,
                      "reasons": f.recompile_reasons}))
""")


def run_process(tmp_path, *lengths):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, KILN_CACHE_DIR=kiln.config.cache_dir,
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script), *map(str, lengths)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_compiles_dynamic_at_once(tmp_path):
    first = run_process(tmp_path, 8, 9, 12)
    assert first["graphs"] == 2                     # static, then dynamic in dim 1
    assert "size mismatch at index 1" in first["reasons"][0]
    files = os.listdir(os.path.join(kiln.config.cache_dir, "dynamic"))
    assert len(files) == 1 and files[0].endswith(".json")
    second = run_process(tmp_path, 10, 11, 30)
    assert second["graphs"] == 1, second           # the profile made it dynamic from the start
    assert second["reasons"] == []
    assert second["symbols"] == first["symbols"]    # the same symbol names in both processes
    assert list(second["symbols"].values()) == ["L['x'].size()[1]"]


def test_profile_file_contents(tmp_path):
    run_process(tmp_path, 8, 9)
    (name,) = os.listdir(os.path.join(kiln.config.cache_dir, "dynamic"))
    data = json.load(open(os.path.join(kiln.config.cache_dir, "dynamic", name)))
    assert data["version"] == 1
    assert data["code"]["qualname"] == "block" and data["code"]["file"].endswith("prog.py")
    assert data["tensors"] == {"L['x']": {"dynamic": [1], "sizes": [2, 9, 16], "dynamic_strides": []}}
    assert data["ints"] == []
    assert not [f for f in os.listdir(os.path.dirname(os.path.join(kiln.config.cache_dir, "dynamic", name)))
                if f.startswith(".tmp")], "atomic write leaves no temporary file"


def test_corrupt_profile_is_ignored_with_a_warning_and_rewritten():
    def f(x):
        return x.sum(0) * x.size(0)

    path = profile_path(code_identity(f.__code__, f.__qualname__, f.__module__))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("{not json")
    cnt = CompileCounter()
    cf = kiln.compile(f, backend=cnt)
    with pytest.warns(RuntimeWarning, match="ignoring the unreadable dynamic-shape profile"):
        x = torch.randn(5, 3)
        torch.testing.assert_close(cf(x), f(x))
    assert cnt.frame_count == 1 and not cf.entries[0].symbols   # static: nothing trusted
    data = json.load(open(path))                                # replaced by a good file
    assert data["version"] == 1 and data["tensors"] == {}


@pytest.mark.parametrize("bad", [
    '{"version": 1, "code": {}, "tensors": {}, "ints": []}',            # another code object
    '{"version": 99}',
    '[1, 2]',
])
def test_profile_for_another_code_or_format_is_not_trusted(bad):
    def g(x):
        return x * 2

    path = profile_path(code_identity(g.__code__, g.__qualname__, g.__module__))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(bad)
    with pytest.warns(RuntimeWarning):
        prof = profile_for(g)
    assert prof.dynamic_dims == {} and prof.dynamic_ints == set()


def test_profile_with_bad_dims_is_not_trusted():
    def g(x):
        return x * 2

    ident = code_identity(g.__code__, g.__qualname__, g.__module__)
    path = profile_path(ident)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"version": 1, "code": ident, "tensors": {"L['x']": {"dynamic": ["zero"]}},
                   "ints": []}, fh)
    with pytest.warns(RuntimeWarning, match="bad dims"):
        prof = profile_for(g)
    assert prof.dynamic_dims == {}


def test_profile_is_keyed_by_code_identity():
    def f(x):
        return x + 1

    def f2(x):
        return x - 1

    a = code_identity(f.__code__, f.__qualname__, f.__module__)
    b = code_identity(f2.__code__, f2.__qualname__, f2.__module__)
    assert a != b and a["bytecode"] != b["bytecode"]
    assert profile_path(a) != profile_path(b)
    assert set(a) == {"file", "module", "qualname", "firstlineno", "bytecode"}


def test_int_dims_found_dynamic_are_stored():
    def f(x, n):
        return x * n

    cnt = CompileCounter()
    cf = kiln.compile(f, backend=cnt)
    for n in (2, 3, 4):
        x = torch.randn(3)
        torch.testing.assert_close(cf(x, n), f(x, n))
    assert cnt.frame_count == 2
    path = profile_path(code_identity(f.__code__, f.__qualname__, f.__module__))
    assert json.load(open(path))["ints"] == ["L['n']"]
    kiln.reset()                       # a new process, as far as kiln knows: read from disk
    cnt2 = CompileCounter()
    cf2 = kiln.compile(f, backend=cnt2)
    for n in (5, 6):
        torch.testing.assert_close(cf2(torch.ones(3), n), f(torch.ones(3), n))
    assert cnt2.frame_count == 1


def test_unwritable_cache_dir_warns_and_still_compiles(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")

    def f(x):
        return x.cos()

    cnt = CompileCounter()
    cf = kiln.compile(f, backend=cnt)
    with kiln.config.patch(cache_dir=str(blocker)):
        with pytest.warns(RuntimeWarning, match="could not write"):
            for n in (4, 5, 6):
                x = torch.randn(n)
                torch.testing.assert_close(cf(x), f(x))
    assert cnt.frame_count == 2


def test_dynamic_false_and_disabled_automatic_dynamic_write_nothing():
    def f(x):
        return x.exp()

    cf = kiln.compile(f, dynamic=False, backend="eager")
    for n in (4, 5):
        cf(torch.randn(n))
    with kiln.config.patch(automatic_dynamic_shapes=False):
        g = kiln.compile(lambda x: x.sin(), backend="eager")
        for n in (4, 5):
            g(torch.randn(n))
    assert not os.path.exists(os.path.join(kiln.config.cache_dir, "dynamic"))
    assert len(cf.entries) == 2
