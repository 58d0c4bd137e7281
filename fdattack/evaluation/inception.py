"""Inception-v3 features from weights on disk, for an FID of inversions in the usual Inception space beside the
evaluation classifier's (Wu et al., ICLR 2024, §4.4, use the latter; nothing is downloaded).

The weights are torchvision's Inception-v3 ``state_dict`` (the file ``torchvision.models.inception_v3`` fetches,
``inception_v3_google-0cc3c7bd.pth``, copied to the machine). Its 2048-d average-pool features are those of the
standard FID up to the network: the FID Inception of pytorch-fid and torch-fidelity is another TensorFlow checkpoint
(2015-12-05) with a few pooling details of its own, so these FIDs compare with each other, not with published ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models import inception_v3

from fdattack.evaluation.weights import load_weights, read_state_dict

INCEPTION_KEY = "evaluation.inversion.inception_weights"
#: Inception-v3's input side
SIZE = 299


class InceptionFeatures(nn.Module):
    """Inception-v3's 2048-d pool features of (N, C, H, W) images in [-1, 1], as torchmetrics' FID feature extractor.

    Google's weights take images in [-1, 1], so torchvision's ``transform_input`` (for ImageNet-normalised input) is
    off; one channel is repeated to three and every image is resized bilinearly to 299×299. Runs in batches of
    ``batch_size`` on ``device`` and returns float64 features on the CPU.
    """

    num_features = 2048

    def __init__(self, net: nn.Module, device: torch.device, batch_size: int = 64) -> None:
        super().__init__()
        self.net = net.eval().to(device)
        self.device = device
        self.batch_size = batch_size

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        features = []
        for start in range(0, images.shape[0], self.batch_size):
            x = images[start : start + self.batch_size].to(self.device, torch.float32)
            x = F.interpolate(x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
            features.append(self.net(x).double().cpu())
        return torch.cat(features) if features else torch.empty(0, self.num_features, dtype=torch.float64)


def load_inception(path: str, device: torch.device) -> InceptionFeatures:
    """torchvision's Inception-v3 with the weights at ``path`` (its auxiliary classifier's may be left out), its
    classifier head removed.

    Raises:
        ConfigError: the file is missing, unreadable or not an Inception-v3 state_dict (named by its key).
    """
    state = read_state_dict(path, INCEPTION_KEY, "torchvision's Inception-v3 state_dict, e.g. inception_v3_google-0cc3c7bd.pth, or null")
    net = inception_v3(weights=None, aux_logits=True, init_weights=False, transform_input=False)
    load_weights(net, state, INCEPTION_KEY, path, "torchvision's Inception-v3", optional="AuxLogits.")
    net.fc = nn.Identity()
    return InceptionFeatures(net, device)
