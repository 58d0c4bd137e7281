"""fdattack: how much private data leaks out of federated distillation and federated learning.

Three sides, each its own folder: the protocol (:mod:`fdattack.fd`), the attacker (:mod:`fdattack.attacks`, which sees
only its :class:`~fdattack.fd.threat.AttackerView`) and the evaluator (:mod:`fdattack.evaluation`, which alone holds
ground truth); :mod:`fdattack.experiment` wires them into a run, :mod:`fdattack.config` composes its settings.
"""

__version__ = "0.2.0"
