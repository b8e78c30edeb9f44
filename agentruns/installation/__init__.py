"""What a Django project needs to run the apps (DESIGN.md 7, "In a host's own Django project"):
the settings of other libraries the apps default when the project leaves them out
(`defaults.py`), and the system checks that name what is missing or wrong, with the line to add
(`checks.py`)."""
