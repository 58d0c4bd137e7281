"""Observers of round records."""

from fdattack.observers.base import Observer, ObserverOutput
from fdattack.observers.confidence_gap import ConfidenceGapObserver, softmax_entropy

__all__ = ["Observer", "ObserverOutput", "ConfidenceGapObserver", "softmax_entropy"]
