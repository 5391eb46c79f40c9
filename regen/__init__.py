"""regen: regenerate the training data of EAGLE-3 draft models with the target's own answers."""

__version__ = "0.1.0"
