"""The fix audit: each fix's regression test with fixes off and on, per torch version.

model (the records: Audit, AuditRow, TestRun), run (the `fixes-audit` command that fills
them), report (markdown, merge, reload). The bisect stage's fix-audit mode uses run.
"""
