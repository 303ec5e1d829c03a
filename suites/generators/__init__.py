"""The generators' cell side: run what distci.fuzz draws (programs, ops, models) on the rank pool and judge it against a single-process reference."""
