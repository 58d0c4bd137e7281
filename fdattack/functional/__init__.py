"""Pure math shared by every side: tensors or arrays in, numbers or tensors out; no I/O, no models, no ground truth.
Imports only torch, numpy, scipy, torchmetrics and other ``fdattack.functional`` modules, never another part of fdattack.
Light helpers re-exported here; by module: ``image`` (SSIM), ``attack_accuracy``, ``membership_metrics``, ``inversion_metrics``."""

from fdattack.functional.accuracy import topk_accuracy
from fdattack.functional.hsic import (
    HSICOptions,
    dependence,
    hsic_biased,
    hsic_loss_term,
    hsic_unbiased,
    kernel_coco,
    kernel_matrix,
    nhsic,
    split_halves,
)
from fdattack.functional.information import entropy, kl_divergence, kl_divergence_from_logits, softmax_entropy
from fdattack.functional.label_avg import label_vector, labelavg_comm_mib, max_vote, smooth_labels, top_k_labels, top_k_upload_bytes
from fdattack.functional.lira import (
    offline_lira,
    offline_lira_float32_lambda,
    offline_lira_log_probability,
    online_lira,
    scaled_confidence,
    scaled_confidence_from_probs,
)
from fdattack.functional.losses import l1_to_logits, soft_cross_entropy, target_class_loss
from fdattack.functional.zeroth_order import forward_difference_gradient, unit_sphere_directions

__all__ = [
    "HSICOptions",
    "dependence",
    "entropy",
    "forward_difference_gradient",
    "hsic_biased",
    "hsic_loss_term",
    "hsic_unbiased",
    "kernel_coco",
    "kernel_matrix",
    "kl_divergence",
    "kl_divergence_from_logits",
    "l1_to_logits",
    "label_vector",
    "labelavg_comm_mib",
    "max_vote",
    "nhsic",
    "offline_lira",
    "offline_lira_float32_lambda",
    "offline_lira_log_probability",
    "online_lira",
    "scaled_confidence",
    "scaled_confidence_from_probs",
    "soft_cross_entropy",
    "smooth_labels",
    "softmax_entropy",
    "split_halves",
    "target_class_loss",
    "top_k_labels",
    "top_k_upload_bytes",
    "topk_accuracy",
    "unit_sphere_directions",
]
