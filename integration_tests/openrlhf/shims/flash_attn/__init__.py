"""TEST-ENVIRONMENT SHIM, not flash-attn.

CPU stand-in: flash-attn 2.8.3 cannot be installed here (its CUDA extension needs nvcc and a
GPU), yet OpenRLHF 0.11.2 imports it at module level (openrlhf/models/ring_attn_utils.py:3-4).
This package provides exactly the names OpenRLHF imports, as the pure-torch functions they
are upstream (flash_attn/bert_padding.py, flash_attn/utils/distributed.py). No attention
kernel is provided, so transformers never selects flash attention. It is put on the path of
.venv-openrlhf only (mk/openrlhf.mk writes a .pth file); it is never shipped in the wheel.
"""

__version__ = "0.0.0+jigsaw-cpu-test-shim"
