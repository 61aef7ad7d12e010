"""Experiments built on simsched (run with python -m experiments.<name>)."""
