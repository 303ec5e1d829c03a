"""Benchmarks behind `nox -s bench -- <what>`: numbers that justify design choices.

harness (rank pool vs torchrun per test; also the dispatcher `run_bench`), provision (a
cell's env, cold and warm); the image bench lives with the images stage.
"""
