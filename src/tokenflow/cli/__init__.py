"""Command-line entry points. Each command module imports heavy libraries inside ``run``."""
