"""The Quantization lens: tensor types by layer and bytes by type (`lens`), one tensor up close (`tensor`), and
the override editor (`overrides`) with its plan preview (`preview`). May import records, data and views.common."""
