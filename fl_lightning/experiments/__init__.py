"""Experiment tooling on top of the library: comparisons over methods and seeds, their reports and the claims table.

Nothing in :mod:`fl_lightning.core` or the Lightning layer imports this package (an import contract checks it).
"""
