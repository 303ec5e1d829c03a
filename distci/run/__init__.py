"""Running suites in a cell's environment: the scenario fuzzer (fuzz)."""
