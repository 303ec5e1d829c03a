"""The generators' cell side: run what distci.fuzz draws (programs, ops, models) on the rank pool."""
