"""servecast faces: the Typer CLI (app/cli.py assembles the commands of app/*_command.py) and the Streamlit dashboard (app/dashboard/)."""
