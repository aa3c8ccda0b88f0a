"""Ray execution of the policies: the only package that imports ray."""
