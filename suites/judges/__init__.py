"""The judges room: whether a run is right.

`checks` and `graph_checks` compare a parallel run with its reference and with the graph
and collectives the row expects; `tolerances` states how close is close enough; `localize`
finds the first module where two runs part; `single_device` projects the table onto one
device and says what each slice row is judged against. Imports the scenario and runner rooms.
"""
