"""The generators' cell side: what runs a drawn case on the rank pool and judges it against the full-tensor reference."""
