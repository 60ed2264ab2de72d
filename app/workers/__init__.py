"""Workers: the one thread boundary. The only package that starts threads.

`engine.Engine` runs jobs (app/jobs/) on `runner.Runner` QThreads and re-emits what they yield as signals;
`saver.Saver` writes files off the GUI thread; `blas` caps numpy's BLAS threads so a core is left to the GUI;
`gc_guard` keeps Python's cyclic collections on the GUI thread while jobs may run (a Qt object freed on a job
thread can deadlock the window).
What crosses to the GUI is a frozen record, never a live engine object. Workers may import jobs, records and
data; controllers and the main window import them, views never do.
"""
