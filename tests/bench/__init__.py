"""Tests of the benchmark (`bench/`)."""
