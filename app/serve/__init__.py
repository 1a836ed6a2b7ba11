"""`servecast serve`: the engine behind an OpenAI-compatible HTTP server."""
