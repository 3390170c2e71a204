"""What a person sees of a run: the live progress view (``progress``) and the end-of-run summary
(``summary``).

May import: layers 1-4 only (no other room of the runtime); rich loads lazily.
"""
