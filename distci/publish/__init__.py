"""What leaves the store for people and systems: the gate's answer (`gate`), the HUD
export (`export`), the webhook (`notify`), the Actions step summary.

The stage above judge and dashboard: it imports them, they never import it.
"""
