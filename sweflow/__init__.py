"""sweflow: software-engineering task datasets to RL/SFT training runs for coding agents."""

__version__ = "0.1.0"
