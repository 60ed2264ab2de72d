"""Controllers: the wiring between the app state, the workers and the views.

`conversation` turns sends, stops and edits into replies and saves; `lenses` asks the workers for lens records
and hands them to the lens widgets; `quant` drives requantizing and comparing. Controllers may import workers,
jobs, records, data, `app.state` and views; only `app.main_window` imports them.
"""
