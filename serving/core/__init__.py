"""TF Serving's ``core/``: the manager, aspired-versions policy, servable states and version labels."""
