"""kiln's differential fuzzer: seeded random programs run eagerly and through kiln.compile.

``generator.generate(seed)`` writes a program, ``runner.run_program`` runs it both ways and
classifies the result, ``minimize`` shrinks a failure; ``python -m tests.fuzz`` is the long
run (see docs/fuzzing.md), ``test_fuzz.py`` the CI slice, ``test_regressions.py`` every failure
found so far."""
