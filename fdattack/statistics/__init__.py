"""The statistics every figure and verdict of fdattack rests on, in one room: what the seeds' aggregates, the matrix,
the headline tables and the claim tests all call.

* :mod:`~fdattack.statistics.kinds`: the kind of every metric (a rate, a positive quantity, a signed one), which sets
  its interval's scale;
* :mod:`~fdattack.statistics.intervals`: 95 % intervals by kind, each over the independent unit;
* :mod:`~fdattack.statistics.membership_bootstrap`: the membership metrics' bootstrap over the candidates;
* :mod:`~fdattack.statistics.across_seeds`: a run's replicas summed up per metric, each seed's within-run spread a
  floor under the seeds';
* :mod:`~fdattack.statistics.paired`: two settings on the same seeds, their paired difference, and Holm's correction
  over a family of them;
* :mod:`~fdattack.statistics.verdicts`: leaks, stopped (an equivalence test with a margin fixed in advance),
  undecided or unknown against a control, a defense that reduces an attack, and α spent over sequential looks.

A new verdict rule belongs in :mod:`~fdattack.statistics.verdicts`; a new metric's kind in
:mod:`~fdattack.statistics.kinds`.
"""
