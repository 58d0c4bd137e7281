"""``fdattack report``: a static HTML page that compares run directories (the offline W&B dashboard).

* :mod:`~fdattack.report.runs`: which runs, their labels (the config keys in which they differ), seeds grouped into
  their mean, metrics laid out by section;
* :mod:`~fdattack.report.figures`: the plots and the reconstruction grids;
* :mod:`~fdattack.report.page`: the page, written whole or not at all (the matrix page writes its own the same way).

The runs are read through :mod:`fdattack.tracking.run_records`.
"""
