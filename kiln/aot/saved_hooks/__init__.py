"""Saved-tensor hooks inlined into the compiled graphs, in one package:

* ``inlining.py``: which hooks are active and inlineable, tracing ``pack`` into the forward and
  ``unpack`` into the backward after the partitioner decided what is saved;
* ``schedule.py``: where in the backward each unpack goes (and the offload copies' streams);
* ``guard.py``: the guard on the active hooks and the values they read;
* ``key.py``: the hooks' part of the compile-cache key (their code, not their identity);
* ``rows.py``: what the inlined hooks did to each graph's saved bytes (``kiln.activations.report``).

The user-facing policies built on them (``kiln.activations``) sit above, in their own package.
"""
