"""Views: the Qt widgets of the app, dumb: records in, signals out.

`chat/`, `attention/`, `quant/` and `compare/` hold one view each with its parts; `positions`, `model_info`,
`status`, `catalog` and `lenses` (the tabs that hold the lens widgets) stand alone; `common/` has the formatting
and colours several views share. Views may import `app.records`, `app.data`, `app.state`, Qt and pyqtgraph,
never `app.jobs`, `app.workers` or `app.controllers`.
"""
