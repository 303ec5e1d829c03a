"""The built-in fixes, one module per upstream bug, each exporting `FIX`."""
