"""benchmarks/models_gpu.py's timing in turns: the columns of a case take turns in whole units
(a pass over qwen2's lengths, a generation), each column's calls go on where its last turn
stopped, and the table takes the step from the turns and the first step and peak from the
fresh processes. One real turns cell runs on the CPU (tiny Qwen2, eager and kiln under
aot_eager). Timings are never asserted."""
import pytest

from benchmark_modules import load_benchmark

pytest.importorskip("transformers")


def _recording_column(bench, name, unit, calls):
    def step(i):
        calls.append((name, i))
    return bench.Prepared(step, unit, 3 * unit, {"first_step_s": 1.0, "losses": [1.0]}, lambda times: len(times))


def test_columns_take_turns_in_whole_units():
    bench = load_benchmark("models_gpu")
    calls = []
    columns = {"eager": _recording_column(bench, "eager", 2, calls),
               "kiln": _recording_column(bench, "kiln", 2, calls)}
    rows = bench.time_in_turns(columns, "cpu", iters=4, warmup=1, rounds=2)
    # warm-up: a unit each; then 2 rounds of 2 units each, in turns; indices go on from 6
    assert calls == ([("eager", 6), ("eager", 7), ("kiln", 6), ("kiln", 7)]
                     + [("eager", i) for i in range(8, 12)] + [("kiln", i) for i in range(8, 12)]
                     + [("eager", i) for i in range(12, 16)] + [("kiln", i) for i in range(12, 16)])
    # every timed call reaches the column's reduction (here: their count)
    assert rows["eager"]["step_ms"] == rows["kiln"]["step_ms"] == 8
    assert rows["kiln"]["timing"] == "turns" and rows["kiln"]["peak_mib"] == 0.0


def test_the_table_takes_steps_from_the_turns_and_the_rest_from_fresh_processes(capsys):
    bench = load_benchmark("models_gpu")
    fresh = [{"case": "bert", "column": c, "first_step_s": f, "step_ms": s, "peak_mib": p, "losses": [2.0],
              "device_name": "cpu"}
             for c, f, s, p in (("eager", 1.0, 30.0, 100.0), ("torch", 11.0, 24.0, 90.0), ("kiln", 6.0, 20.0, 80.0))]
    turns = [{"case": "bert", "column": c, "first_step_s": None, "step_ms": s, "peak_mib": 0.0, "losses": [2.0],
              "timing": "turns", "rounds": 5, "device_name": "cpu"}
             for c, s in (("eager", 31.0), ("torch", 22.0), ("kiln", 25.0))]
    turns.append({"case": "t5", "column": "kiln", "crash": "timeout", "timing": "turns"})
    rows = {(r["case"], r["column"]): r for r in bench.with_turns(fresh, turns)}
    kiln_row = rows[("bert", "kiln")]
    assert (kiln_row["step_ms"], kiln_row["step_ms_alone"], kiln_row["first_step_s"], kiln_row["peak_mib"]) == (
        25.0, 20.0, 6.0, 80.0)
    assert ("t5", "kiln") not in rows                  # a crashed turns cell adds nothing
    assert bench.turns_only(turns[0]) and not bench.turns_only(kiln_row)
    bench.print_summary(rows)
    out = capsys.readouterr().out
    assert "step: geomean 1.136x" in out               # 25 / 22: the turns' steps
    assert "cold compile: geomean 0.500x" in out       # (6 - 1) / (11 - 1): the fresh processes'
    assert "peak memory: geomean 0.889x" in out
    # rows timed only in turns print without a first step or a cold compile
    bench.print_table(turns[:3], [{}], bench.argparse.Namespace(peak_tflops=None, peak_tbps=None))
    out = capsys.readouterr().out
    assert "| bert | kiln | 25.00 | 1.14x | - |" in out and "cold compile: not measured" in out


def test_a_turns_cell_runs_its_columns_in_one_process(monkeypatch):
    import kiln

    bench = load_benchmark("models_gpu")
    monkeypatch.setattr(bench, "compiler", lambda column, case: (
        (lambda m: kiln.compile(m, backend="aot_eager")) if column == "kiln" else (lambda m: m)))
    kiln.reset()
    got = bench.run_one({"case": "qwen2", "turns": ["eager", "kiln"], "rounds": 2}, "cpu", tiny=True, iters=2,
                        warmup=1)
    eager, compiled = got["rows"]["eager"], got["rows"]["kiln"]
    lengths = [str(n) for n in bench.TINY["qwen2"]["lengths"]]
    for row in (eager, compiled):
        assert row["timing"] == "turns" and row["first_step_s"] is None
        assert list(row["step_ms_by_length"]) == lengths
        assert row["step_ms"] == pytest.approx(sum(row["step_ms_by_length"].values()))
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-4)
    assert compiled["graphs"] >= 1 and eager["flops"] > 0
