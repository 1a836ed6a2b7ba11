"""servecast simulator (see ../shared/DESIGN.md). Imports no torch."""
