"""The generators' cell side: runs a drawn case on the rank pool, judges it against the full-tensor op."""
