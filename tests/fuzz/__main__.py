"""kiln's differential fuzzer, for long runs.

    python -m tests.fuzz --seeds 0:5000 --backend aot_eager [--backend eager] [--dynamic|--both]
                         [--out fuzz-failures] [--timeout 120]

Generates the programs of the seeds, runs each eagerly and through ``kiln.compile`` with each
backend (and ``dynamic=True`` with ``--dynamic``, both settings with ``--both``), prints every
failure as it happens, then the counts per backend (programs, ok, wrong, crashed, float noise:
``noise.py``), the
failures grouped by signature, kiln's internal errors (a frame that ran eagerly or broke because
of a kiln bug: not wrong, but a compile lost) with their first line and count, and how often
programs used each construct. Each failing
program is written to ``--out`` with its failure in a comment; ``python -m
tests.fuzz.minimize SEED --backend B`` shrinks one.
"""
from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import time
import warnings

import kiln

from .generator import generate
from .runner import available_backends, run_program


class FuzzTimeout(BaseException):
    """Raised by the alarm: a BaseException, so the program's own ``except Exception`` and
    the observer let it through."""


def _alarm(signum, frame):
    raise FuzzTimeout()


_stopping = []


def _stop(signum, frame):
    _stopping.append(signum)    # finish the current program, then print what was counted


def parse_seeds(text: str) -> range:
    lo, _, hi = text.partition(":")
    return range(int(lo), int(hi)) if hi else range(int(lo), int(lo) + 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:200", help="LO:HI (HI excluded)")
    ap.add_argument("--backend", action="append", help="eager, aot_eager, inductor (repeatable; default: all available)")
    ap.add_argument("--dynamic", action="store_true", help="compile with dynamic=True")
    ap.add_argument("--both", action="store_true", help="both dynamic=None and dynamic=True")
    ap.add_argument("--out", default="fuzz-failures", help="directory for failing programs")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per program and setting")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    backends = args.backend or available_backends()
    missing = [b for b in backends if b not in available_backends((b,))]
    if missing:
        print(f"skipping backends kiln does not have: {missing}")
        backends = [b for b in backends if b not in missing]
    dynamics = [None, True] if args.both else [True] if args.dynamic else [None]
    settings = [(b, d) for b in backends for d in dynamics]
    counts = {s: collections.Counter() for s in settings}
    sigs: dict = collections.defaultdict(list)
    internal: dict = collections.defaultdict(list)
    tags = collections.Counter()
    raised_in = set()
    seeds = parse_seeds(args.seeds)
    print(f"kiln from {os.path.dirname(os.path.dirname(kiln.__file__))}; backends {backends}, dynamic {dynamics}",
          flush=True)
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGTERM, _stop)
    start = time.time()
    done = 0
    try:
        for seed in seeds:
            if _stopping:
                break
            _run_seed(seed, settings, args, counts, sigs, internal, tags, raised_in)
            done += 1
    except KeyboardInterrupt:
        pass
    if done < len(seeds):
        print(f"\nstopped after {done} programs")
    eager_raised = len(raised_in)
    elapsed = time.time() - start
    n = done
    print(f"\n{n} programs, {elapsed:.0f} s")
    print(f"{'backend':<12}{'dynamic':<9}{'programs':>9}{'ok':>7}{'wrong':>7}{'crashed':>9}{'invalid':>9}"
          f"{'timeout':>9}{'noise':>7}{'internal':>10}")
    for (backend, dynamic), c in counts.items():
        print(f"{backend:<12}{str(dynamic):<9}{sum(c[k] for k in c if k != 'internal'):>9}{c['ok']:>7}"
              f"{c['wrong']:>7}{c['crash']:>9}{c['invalid'] + c['generator error']:>9}{c['timeout']:>9}"
              f"{c['noise']:>7}{c['internal']:>10}")
    if sigs:
        print("\nfailures by signature (count, example seeds):")
        for sig, where in sorted(sigs.items(), key=lambda kv: -len(kv[1])):
            ex = ", ".join(f"{s} ({b}{', dyn' if d else ''})" for s, b, d in where[:4])
            print(f"{len(where):>5}  {sig}\n         e.g. {ex}")
    if internal:
        print("\nkiln internal errors (programs, example seeds): frames run eagerly or broken by a kiln bug")
        for sig, where in sorted(internal.items(), key=lambda kv: -len(kv[1])):
            ex = ", ".join(f"{s} ({b}{', dyn' if d else ''})" for s, b, d in where[:4])
            print(f"{len(where):>5}  {sig}\n         e.g. {ex}")
    print("\nconstructs (share of programs):")
    print("  " + ", ".join(f"{t} {100 * c / max(n, 1):.0f}%" for t, c in tags.most_common()))
    print(f"  eager raised in {100 * eager_raised / max(n, 1):.0f}% of programs")
    return 1 if any(c["wrong"] or c["crash"] for c in counts.values()) else 0


def _run_seed(seed, settings, args, counts, sigs, internal, tags, raised_in):
    """Generate one program and run it in every setting, recording the outcomes."""
    try:
        prog = generate(seed)
    except Exception as e:  # noqa: BLE001 - a generator bug: count it, go on
        print(f"seed {seed}: the generator failed: {type(e).__name__}: {e}")
        for s in settings:
            counts[s]["generator error"] += 1
        return
    tags.update(prog.tags)
    raised = False
    for backend, dynamic in settings:
        signal.alarm(args.timeout)
        try:
            out = run_program(prog, backend, dynamic)
        except FuzzTimeout:
            counts[(backend, dynamic)]["timeout"] += 1
            print(f"seed {seed} [{backend}, dynamic={dynamic}] timed out")
            continue
        finally:
            signal.alarm(0)
        counts[(backend, dynamic)][out.status] += 1
        if out.internal:
            counts[(backend, dynamic)]["internal"] += 1
            for sig in out.internal:
                internal[sig].append((seed, backend, dynamic))
            if not args.quiet:
                print(f"seed {seed} [{backend}{', dynamic' if dynamic else ''}] kiln internal error: "
                      + "; ".join(out.internal)[:400], flush=True)
        raised = raised or out.eager_raised
        if out.status != "ok":
            sigs[out.signature].append((seed, backend, dynamic))
            if not args.quiet:
                print(out.describe()[:600], flush=True)
            _write(args.out, prog, out)
    if raised:
        raised_in.add(seed)


def _write(out_dir, prog, outcome):
    sub = os.path.join(out_dir, outcome.backend + ("-dynamic" if outcome.dynamic else ""))
    os.makedirs(sub, exist_ok=True)
    header = [f"# {line}" for line in outcome.describe().splitlines()]
    header.append(f"# calls: {prog.calls}")
    dyn = " --dynamic" if outcome.dynamic else ""
    header.append(f"# rerun: python -m tests.fuzz --seeds {prog.seed} --backend {outcome.backend}{dyn}")
    header.append(f"# shrink: python -m tests.fuzz.minimize {prog.seed} --backend {outcome.backend}{dyn}")
    with open(os.path.join(sub, f"seed_{prog.seed}.py"), "w") as f:
        f.write("\n".join(header) + "\n\n" + prog.source())


if __name__ == "__main__":
    sys.exit(main())
