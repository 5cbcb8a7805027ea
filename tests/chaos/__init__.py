"""The chaos run (`make chaos`, `python -m tests.chaos`): faults and hostile clients against real
processes on loopback; not collected by pytest."""
