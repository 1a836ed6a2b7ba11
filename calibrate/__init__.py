"""servecast calibrate (see ../shared/DESIGN.md). Imports no torch."""
