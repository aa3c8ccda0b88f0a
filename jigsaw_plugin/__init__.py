"""jigsaw-plugin: multiplex, resize and migrate RL post-training pipelines (verl, OpenRLHF).

Core imports no host framework (verl, OpenRLHF, vLLM, torch, Ray) at import time.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
