"""Plumbing every layer of scepsy may import (it imports no other scepsy package).

* :mod:`scepsy_common.errors`: :class:`~scepsy_common.errors.InputError` and its kin, the one
  way bad user input is reported (the CLI turns it into one line and exit code 2).
* :mod:`scepsy_common.files`: reading the project's files with clear errors, atomic writes.
* :mod:`scepsy_common.units`: GPU shares counted in thousandths of a GPU (exact integers).
* :mod:`scepsy_common.bisection`: the largest value a monotone predicate accepts.
* :mod:`scepsy_common.rates`: the one rule of every rate (``--rate``, targets, load events).

Layers, each importing only those before it: ``scepsy_common`` ← ``scepsy_profile`` ←
``scepsy_opt`` ← ``scepsy_place`` ← ``scepsy_serve`` ← ``scepsy`` (``.importlinter``; the
tests run ``lint-imports``).
"""
