"""verl adapter; imports verl lazily, never at ``import jigsaw_plugin`` time."""
