"""The base layout's parts: the navigation (links other apps register, live counts) and the error pages."""
