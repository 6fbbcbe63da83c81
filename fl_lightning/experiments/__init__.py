"""Experiment tooling on top of the library: comparisons over methods and seeds, their reports and the claims table.

- :mod:`~fl_lightning.experiments.compare`: a comparison's YAML and running its fits;
- :mod:`~fl_lightning.experiments.report`: a comparison's report, from :mod:`~fl_lightning.experiments.runs`
  (reading run directories), :mod:`~fl_lightning.experiments.aggregate` (per-seed rows and summaries),
  :mod:`~fl_lightning.experiments.published` (published numbers beside ours),
  :mod:`~fl_lightning.experiments.tables` (Markdown and CSV) and :mod:`~fl_lightning.experiments.figures` (PNGs);
- :mod:`~fl_lightning.experiments.claims`: the papers' claims beside the reports, with a verdict each;
- :mod:`~fl_lightning.experiments.includes`: README sections generated from result files.

Nothing in :mod:`fl_lightning.core` or the Lightning layer imports this package (an import contract checks it).
"""
