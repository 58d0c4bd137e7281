"""Many models of one architecture trained and queried as one: stacked weights under ``torch.func.vmap``.

The clients of a simulation (K = 10 to 1,000) and LiRA's shadow students (8 to 32 per target client,
issue #8) are many copies of one small network, each trained on its own data. Trained one by one, a
round costs K times the tiny steps of one model. Here the copies' parameters, buffers and optimizer
states are stacked along a leading model axis, and every mini-batch step is one vmapped
``torch.func.functional_call`` of the shared network, one backward pass and one optimizer update for
all of them.

:func:`fit_copies` is the "train N copies" API: it takes the engine's :class:`~fdattack.engine.trainer.FitJob`
list (one job per model) and gives each model exactly the steps :meth:`LocalTrainer.fit
<fdattack.engine.trainer.LocalTrainer.fit>` would: the same seeded batch order (epoch e shuffles with
``derive_seed(seed, e)``), the same batch size, no padding (models whose set sizes differ meet in
sub-groups of equal batch size: the tail steps form small groups, so BatchNorm statistics and mean losses
see exactly the loop's rows), Adam or SGD arithmetic as ``torch.optim`` does it, and BatchNorm running
statistics per model. Weights, buffers and optimizer states are read from and written back into each
model's module and ``torch.optim`` optimizer, so checkpoints, resume and later per-model phases are
unchanged. The results equal the loop's up to float rounding: vmapped convolutions and batched matrix
products sum in another order (``tests/test_vectorised.py`` states the tolerance). The protocols' client
phases reach it through :meth:`LocalTrainer.fit_many <fdattack.engine.trainer.LocalTrainer.fit_many>`; LiRA's
shadow students (``lira_distill``) train through the same call. :func:`predict_copies` is the inference
counterpart (:meth:`LocalTrainer.predict_many <fdattack.engine.trainer.LocalTrainer.predict_many>`).

Five things make the path fast on a CPU, each measured on one thread: the vmapped networks run their 2-D
convolutions as im2col + matrix product with channels-last results (:class:`~fdattack.engine.vectorised.copies._CpuLayers`; without it a
FedMD
round of K = 100 digits clients takes 2.3x as long), and their linear layers as batched products in the
orientations that are fast on a CPU (:mod:`fdattack.engine.vectorised.kernels.batched_linear`; MNIST's shadow students 1.09x as fast,
their linear weight gradient 7x); an activation directly followed by max-pooling runs after the pool
(:func:`~fdattack.engine.vectorised.copies._pool_first`; 6 to 20% on the digits round); a convolution that takes the data and the max-pool
after it
run as one layer in cache-sized chunks where a model's batch of its outputs is large (:mod:`fdattack.engine.vectorised.kernels.conv_pool`;
MNIST's shadow students 1.65x as fast); and the activations of one call are bounded
(:data:`~fdattack.engine.vectorised.copies.CPU_ELEMENTS_PER_CALL`). The ``fdattack`` command also keeps freed memory for reuse
(:func:`fdattack.engine.malloc.keep_freed_memory`; 18% on the digits round).
``benchmarks/bench_engine.py`` and ``benchmarks/bench_students.py`` measure the result.

:func:`fit_private_copies` trains jobs that carry DP-SGD's steps (:class:`~fdattack.engine.jobs.PrivateSteps`) the same
way, each step one vmapped per-sample gradient computation (``vmap`` over the models of ``vmap(grad)`` over the rows),
clipped, summed and noised as opacus does it (:mod:`fdattack.engine.vectorised.private`); a linear layer on one vector
a row is clipped from its output gradients and inputs without forming its per-row weight gradients
(:mod:`fdattack.engine.vectorised.ghost`).

:func:`unsupported` says why a job cannot take this path (a training defense, an objective not declared
:func:`~fdattack.lit.classifier.vmappable`, dropout, an optimizer other than plain Adam or SGD, ...);
:func:`group_key` says which jobs can share a call.
"""

from fdattack.engine.vectorised.copies import architecture, fit_copies, group_key, is_plain_classifier, predict_copies, unsupported
from fdattack.engine.vectorised.private import fit_private_copies

__all__ = ["architecture", "fit_copies", "fit_private_copies", "group_key", "is_plain_classifier", "predict_copies", "unsupported"]
