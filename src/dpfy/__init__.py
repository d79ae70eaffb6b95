"""dpfy: differentially private training for PyTorch, with accounting you can report."""

__version__ = "0.1.0"
