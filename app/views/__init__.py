"""Qt widgets of the app: chat, lenses, panels."""
