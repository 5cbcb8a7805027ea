"""TF Serving's ``model_servers/``: flags, the server composition and its gRPC and REST front ends."""
