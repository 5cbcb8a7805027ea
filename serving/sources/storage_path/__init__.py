"""TF Serving's ``sources/storage_path/``: sources of version directories on a file system."""
