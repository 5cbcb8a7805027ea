"""TF Serving's ``sources/``: where servables come from."""
