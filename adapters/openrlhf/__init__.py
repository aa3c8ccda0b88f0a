"""OpenRLHF adapter; imports OpenRLHF lazily, never at ``import jigsaw_plugin`` time."""
