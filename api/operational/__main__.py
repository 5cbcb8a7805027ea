"""`python -m api.operational`: the operational port's server (`api.operational.server`)."""

from api.operational.server import main

main()
