"""Blind batch 2026-12-03: broken hosts, one contract rule each (see README.md)."""
