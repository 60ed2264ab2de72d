"""GGUF Lens desktop app: a chat beside lenses that show what happens inside the model.

Data flows one way: `jobs/` (plain generators, no Qt) run the engine on the threads that `workers/` starts and
yield `records/` (frozen dataclasses, no Qt) back across that one thread boundary; `controllers/` wire workers,
`state.py` and the dumb `views/` together; `main_window.py` builds the window; `data/` holds chats, settings and
type overrides on disk. The layers and the no-Qt rule are import-linter contracts in pyproject.toml.
"""
