# A package, so that its conftest is imported as distributed.conftest and never stands in for
# tests/conftest.py, which the other test modules import by the name `conftest`.
