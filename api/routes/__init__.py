"""HTTP routes of the API, one module per concern."""
