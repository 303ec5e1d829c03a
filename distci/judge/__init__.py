"""Judge: from run directories to answers.

ingest (lossless, a transaction per run) -> store (the SQLite index) -> verdicts (pure:
an outcome against history and known issues) -> gate (coverage-aware release answer),
export (the HUD), notify. The dashboard reads what this stage judged.
"""
