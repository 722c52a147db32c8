"""Inductor's CPU vector-ISA probe remembered per machine (kiln/backends/inductor/vec_isa_memo.py): a
later process takes the stored answer only when every fact the probe depends on is the same."""
import functools
import json
import os

import pytest

from kiln.backends.inductor import vec_isa_memo as M


@pytest.fixture
def isa(monkeypatch):
    """torch's ISA module with a stand-in for its probe (the real one builds and dlopens
    libraries in subprocesses): ``probed()`` tells whether it ran."""
    import torch._inductor.cpu_vec_isa as isa

    runs = []
    answer = [isa.supported_vec_isa_list[-3], isa.supported_vec_isa_list[-4]]
    # (a package loaded earlier in this process offered its records: not these tests')
    monkeypatch.setattr(M, "_offered", [])

    def fresh_probe():
        @functools.cache
        def valid_vec_isa_list():
            runs.append(1)
            return list(answer)
        monkeypatch.setattr(isa, "valid_vec_isa_list", valid_vec_isa_list)
    fresh_probe()
    isa.fresh_probe, isa.runs, isa.answer = fresh_probe, runs, answer
    yield isa
    for name in ("fresh_probe", "runs", "answer"):
        delattr(isa, name)


def test_a_later_process_takes_the_stored_answer_without_probing(isa, tmp_path):
    assert not M.prime(str(tmp_path))            # nothing stored yet: torch probes
    M.remember(str(tmp_path))                    # (not computed yet: nothing to store)
    assert not os.path.exists(tmp_path / "vec_isa")
    assert isa.valid_vec_isa_list() == isa.answer and isa.runs == [1]
    M.remember(str(tmp_path))
    [record] = os.listdir(tmp_path / "vec_isa")
    isa.fresh_probe()                            # "a new process"
    assert M.prime(str(tmp_path))
    assert isa.valid_vec_isa_list() == isa.answer and isa.runs == [1]    # not probed again
    assert isa.pick_vec_isa() is isa.answer[0]


def test_another_machine_or_a_bad_record_probes_again(isa, tmp_path, monkeypatch):
    isa.valid_vec_isa_list()
    M.remember(str(tmp_path))
    [name] = os.listdir(tmp_path / "vec_isa")
    isa.fresh_probe()
    real = M._facts
    monkeypatch.setattr(M, "_facts", lambda: {**real(), "compiler": ["g++", "gcc version 99"]})
    assert not M.prime(str(tmp_path))            # another compiler: another record name
    monkeypatch.setattr(M, "_facts", real)
    path = tmp_path / "vec_isa" / name
    record = json.loads(path.read_text())
    record["names"] = ["avx9000"]
    path.write_text(json.dumps(record))
    assert not M.prime(str(tmp_path))            # names that do not match torch's list
    path.write_text("{not json")
    assert not M.prime(str(tmp_path))            # unreadable: ignored
    assert isa.valid_vec_isa_list() == isa.answer and isa.runs == [1, 1]


def test_the_default_cache_dir_is_under_home_not_a_literal_tilde():
    from kiln.backends.inductor import vec_isa_memo

    path = vec_isa_memo._path(os.path.join("~", ".cache", "kiln"), {"cpu": "x"})
    assert not path.startswith("~") and path.startswith(os.path.expanduser("~"))
