"""Development tools of this repository (lint, coverage table, diagnostics): not shipped in distci."""
