"""Run: one execution of a Cell, from its environment to a closed run directory.

cellrun (provision -> pytest -> external suites -> rundir) is the seam the CLI calls;
terminal and progress own what a person sees while it runs; runreport re-prints a run;
fuzz runs the scenario fuzzer's batches on one cell through cellrun (fuzz_report: what
it writes).
"""
