"""TEST-ENVIRONMENT SHIM (see flash_attn/__init__.py)."""
