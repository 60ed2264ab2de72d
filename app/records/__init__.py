"""Records: frozen dataclasses of numpy arrays and plain values that cross from the worker threads to the views.

No record holds a live engine object (no QTensor, no view into the KV cache): every array is a copy, so a record
may cross to the GUI thread while the model keeps running. The make_* functions do the work (recompute attention
from the recorded queries and the cache, dequantize a tensor) and are called from jobs on a worker thread.
Records may import `engine` and each other only: no Qt, and nothing else of the app (the bottom layer).
"""
