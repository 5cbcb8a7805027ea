"""The test suite: `tests/support.py` holds the helpers every test shares (free ports,
polling, child processes, the serving and API starters); `tests/api`, `tests/serving`,
`tests/bench` and `tests/tools` mirror the packages they test; the top-level modules are
end-to-end tests of both tiers together. Import helpers as `from tests.support import ...`."""
