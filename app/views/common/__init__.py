"""Formatting and colours shared by several views: token labels and the token axis, colormaps and ggml type
colours, byte counts. May import Qt and pyqtgraph only, nothing else of the app."""
