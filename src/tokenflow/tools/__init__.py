"""Scripts run with ``python -m tokenflow.tools.<name>``: rebuilding the shipped tiny models, the
CLI reference page. Front ends (layer 6): they may import anything below.
"""
