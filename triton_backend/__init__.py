"""Files copied into Triton model repositories (not imported from here at serve time)."""
