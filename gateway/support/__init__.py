"""Small mechanisms every room uses, written once: tables bounded by evicting their oldest entry, delays
that double up to a cap, tasks that live as long as the app, and cancels that stick on Python 3.11.

Imports nothing of the gateway: every package may import it.
"""
