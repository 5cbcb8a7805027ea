"""Tests of the API tier (`api/`); `stack` and `fake_serving` are their own helpers."""
