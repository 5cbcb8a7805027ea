"""Tests of the developer tools (`tools/`)."""
