"""Version-guarded monkeypatches of host frameworks; installed as ``jigsaw_plugin.patches``."""
