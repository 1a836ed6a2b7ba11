"""servecast faces: the Typer CLI (app.cli) and, later, the Streamlit dashboard."""
