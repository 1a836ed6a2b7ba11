"""The Streamlit app (`servecast app`): pages over the planner and the simulator."""
