"""The judges room: what a run recorded and whether it is right.

`evidence` and `collectives` record (train records, graph evidence, every collective);
`checks` and `graph_checks` compare a parallel run with its reference and with the graph the
row expects; `tolerances` states how close is close enough; `localize` finds the first module
where two runs part; `single_device` judges the table's one-device slice.
"""
