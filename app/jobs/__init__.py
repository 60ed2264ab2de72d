"""Jobs: the plain generators the workers run (fetch and load, generate, lens, requantize, compare).

Each job takes the `Session` (jobs/session.py) or its own models, an `emit` callback and a cancel event, and
yields records. No Qt and no threads here: a job may import `app.records`, `app.data` and `engine`, never
PySide6, pyqtgraph, superqt, `app.workers`, `app.controllers`, `app.views` or `app.main_window`.
"""
