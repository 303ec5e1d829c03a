"""The generators' engines (configurations, programs, ops, models): draw, run through a cell,
shrink, report. Controller side: the cell side (what a configuration is, how it runs) lives
in suites/, loaded by name (distci.fuzz.space.cell_side), never imported.
"""
