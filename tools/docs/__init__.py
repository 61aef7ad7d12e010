"""The documentation generators: ``python -m tools.docs.check_docs`` regenerates and checks every
result quoted in README.md and docs/ (see :mod:`tools.docs.check_docs`)."""
