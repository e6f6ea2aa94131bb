"""Files copied into model archives (not imported at serve time from here)."""
