"""The leakage matrix: every attack against every protocol under every defense, from one command
(``fdattack matrix MATRIX.yaml``, :mod:`.command`), one simulation per (data, protocol, defense, seed) observed by every
applicable attack (:mod:`.plan`), run here or by W&B agents (:mod:`.run`), with intervals across seeds (:mod:`.outputs`).
"""
