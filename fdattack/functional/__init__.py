"""Pure math shared across the attack families and protocols: information measures, distillation losses,
top-k accuracy, LiRA scores (pdafd.md §6.1) and the zeroth-order gradient estimator (lattack.md Eq. 6)."""

from fdattack.functional.accuracy import topk_accuracy
from fdattack.functional.information import entropy, kl_divergence, kl_divergence_from_logits, softmax_entropy
from fdattack.functional.lira import (
    offline_lira,
    offline_lira_float32_lambda,
    offline_lira_log_probability,
    online_lira,
    scaled_confidence,
    scaled_confidence_from_probs,
)
from fdattack.functional.losses import l1_to_logits, soft_cross_entropy
from fdattack.functional.zeroth_order import forward_difference_gradient, unit_sphere_directions

__all__ = ["entropy", "forward_difference_gradient", "kl_divergence", "kl_divergence_from_logits", "l1_to_logits", "offline_lira",
           "offline_lira_float32_lambda", "offline_lira_log_probability", "online_lira", "scaled_confidence",
           "scaled_confidence_from_probs", "soft_cross_entropy", "softmax_entropy", "topk_accuracy", "unit_sphere_directions"]
