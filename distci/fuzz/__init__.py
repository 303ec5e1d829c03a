"""The generators' engines (configurations, programs, ops, models): draw, run through a cell, shrink, report."""
