"""Small helpers shared by the protocol cores."""
