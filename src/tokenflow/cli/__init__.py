"""Command-line entry points. Each command module imports heavy libraries inside ``run``.

May import: every layer (1-6): the top of the house; other front ends (``bench``, ``report``,
``sim``) through the commands they register.
"""
