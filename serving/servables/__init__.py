"""TF Serving's ``servables/``: the kinds of servable this server runs."""
