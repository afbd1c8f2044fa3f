"""Algorithms: thin calls over the build step (`compiler`) and the shim's launch driver."""
