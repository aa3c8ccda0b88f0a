"""Host-framework adapters (verl, OpenRLHF); installed as ``jigsaw_plugin.adapters``."""
