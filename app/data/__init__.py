"""Data: what the app keeps for the user, as plain objects: chats, their store on disk with the settings, type overrides.

No Qt here. Data may import `app.records` (chats hold token records, overrides are previewed from a ModelRecord)
and `engine`, never jobs, workers, controllers or views.
"""
