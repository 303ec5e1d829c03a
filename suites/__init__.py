"""distci's distributed suites: pytest files that run inside cell environments.

A package (not loose test files) so every module is importable by one stable name,
`suites.<module>`: pytest's default import mode puts the directory above `suites/` on
sys.path, in the repo and wherever a cell environment or image copies the folder, and
the rank workers import scenario dataclasses and test functions by that same name.
"""
