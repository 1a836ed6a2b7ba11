"""Validation against the real engine on this device (`servecast validate`): the same requests replayed
through the engine and simulated, with the machine's measured speed. No torch on import."""
